//! Hash maps and sets for the load's and the build's own bookkeeping (maps of value and
//! weight names, `prepare`'s counts of readers by value name, the build's weights before the
//! program takes them), with foldhash's hasher instead of std's SipHash: hashing names was a
//! sixth of a small model's load on the thread that plans and builds it, and tables grown one
//! insert at a time rehashed every name again (BENCHMARKS.md, issue 14). The hasher is seeded
//! at random per process, as std's is. `prepare`'s public functions that take the weights
//! accept a map with any hasher; what the crate's public API returns stays std's.

/// A `HashMap` with foldhash's hasher; make one with `default()` or `with_capacity_and_hasher`.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` with foldhash's hasher.
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
