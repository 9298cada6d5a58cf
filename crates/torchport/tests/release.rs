//! `Checkpoint::release_bytes` drops exactly the pages under a stretch of the memory-mapped
//! file (seen in /proc/self/smaps on Linux), the data reads back unchanged afterwards, and
//! bytes that are not part of the mapped file are left alone.

use std::borrow::Cow;

use torchport::write::{OutputFormat, WriteOptions};
use torchport::{DType, OutTensor};

#[path = "common/smaps.rs"]
mod smaps;
use smaps::mapped_resident;

#[test]
fn release_bytes_drops_the_pages_of_a_stretch_and_nothing_else() {
    const N: usize = 4 << 20; // 16 MiB of float32
    let dir = std::env::temp_dir().join(format!("torchport-release-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("one.pt");
    let bytes: Vec<u8> = (0..N).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let t = OutTensor::new("w", DType::F32, vec![N], move || {
        Ok(Cow::Owned(bytes.clone()))
    });
    torchport::write::write(&path, OutputFormat::TorchZip, &[t], WriteOptions::default()).unwrap();

    let ckpt = torchport::open(&path).unwrap();
    let info = ckpt.tensor("w").unwrap();
    let data = ckpt.data(info).unwrap();
    assert!(
        matches!(data, Cow::Borrowed(_)),
        "float32 data is borrowed from the map"
    );
    let sum = |d: &[u8]| d.iter().map(|&b| b as u64).sum::<u64>();
    let total = sum(&data); // touches every page
    let before = mapped_resident(&path);

    // Release the first half: that many fewer resident bytes (the kernel may drop up to a
    // whole huge page more at the edge of the stretch), the second half still resident.
    ckpt.release_bytes(&data[..N * 2]);
    let after = mapped_resident(&path);
    if let (Some(b), Some(a)) = (before, after) {
        assert!(
            b >= N * 4,
            "{b} bytes resident after reading {} bytes",
            N * 4
        );
        let dropped = b - a;
        let (half, edge) = (N * 2, 4 << 20);
        assert!(
            dropped + (64 << 10) >= half && dropped <= half + edge,
            "released {dropped} bytes, expected {half} (+ at most {edge})"
        );
    }
    assert_eq!(sum(&data), total, "the data reads back unchanged");
    assert_eq!(&data[4..8], &1f32.to_le_bytes());

    // Bytes on the heap are not part of the map: left alone (and readable).
    let copy = data.to_vec();
    ckpt.release_bytes(&copy);
    assert_eq!(sum(&copy), total);
    std::fs::remove_dir_all(&dir).ok();
}
