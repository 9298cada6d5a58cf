//! Hash maps and sets for the load's own bookkeeping (the plan's and the decode's maps of
//! value and weight names, and `prepare`'s counts of readers by value name), with foldhash's hasher instead of std's SipHash: hashing names
//! was a sixth of a small model's load on the thread that plans and builds it (BENCHMARKS.md,
//! issue 14). The hasher is seeded at random per process, as std's is. Maps that cross the
//! crate's public API (the build's weights, `prepare`'s arguments) stay std's.

/// A `HashMap` with foldhash's hasher; make one with `default()` or `with_capacity_and_hasher`.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` with foldhash's hasher.
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
