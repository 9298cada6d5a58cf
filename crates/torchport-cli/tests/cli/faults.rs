//! Faults through the real binary: `convert` killed (SIGKILL) or interrupted (SIGINT) part-way
//! through writing leaves nothing in the output folder but what was there before; with the
//! named-temporary-file fallback a kill leaves a temporary file that the next run reports and
//! removes (or `--clean` does).
//!
//! Each kill is aimed by watching `/proc/PID/fd` for a descriptor open in the output folder
//! (an unnamed `O_TMPFILE` file shows as `FOLDER/#INODE (deleted)`), and the test counts the
//! kills that landed while it was still open, so it cannot pass without killing mid-write.
#![cfg(target_os = "linux")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// 20 f32 tensors of 6 MiB each: 120 MiB, enough for a write to take a while.
const TENSORS: usize = 20;
const ELEMS: usize = 6 << 18;

/// A safetensors input written by hand (header + data), in `dir`.
fn big_input(dir: &Path) -> PathBuf {
    let path = dir.join("big.safetensors");
    let mut header = String::from("{");
    for i in 0..TENSORS {
        let (b, e) = (i * ELEMS * 4, (i + 1) * ELEMS * 4);
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layer{i}.weight\":{{\"dtype\":\"F32\",\"shape\":[{ELEMS}],\"data_offsets\":[{b},{e}]}}"
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let mut data: Vec<u8> = (0..ELEMS).flat_map(|j| (j as f32).to_le_bytes()).collect();
    for i in 0..TENSORS {
        data[..4].copy_from_slice(&(i as f32).to_le_bytes());
        f.write_all(&data).unwrap();
    }
    f.flush().unwrap();
    path
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn convert(args: &[&Path], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_torchport"));
    c.arg("convert").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start torchport")
}

/// Whether process `pid` has a descriptor open on a file in `dir`.
fn writing_into(pid: u32, dir: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|target| target.parent() == Some(dir))
}

/// Start a convert, wait until it is writing into `out`'s folder, wait `delay` more and
/// send `signal` (`KILL` or `INT`). Returns whether the signal landed mid-write (the output
/// was still open and the process still running just before it) and the exit status.
fn interrupt(
    input: &Path,
    out: &Path,
    delay: Duration,
    signal: &str,
    env: &[(&str, &str)],
) -> (bool, std::process::ExitStatus) {
    let dir = out.parent().unwrap().canonicalize().unwrap();
    let mut child = convert(&[input, out], env);
    let pid = child.id();
    let start = Instant::now();
    while !writing_into(pid, &dir) {
        if child.try_wait().unwrap().is_some() || start.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    std::thread::sleep(delay);
    let mid_write = writing_into(pid, &dir) && child.try_wait().unwrap().is_none();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success() || !mid_write);
    let status = child.wait().unwrap();
    (mid_write, status)
}

#[test]
fn killed_converts_leave_nothing_behind() {
    let input_dir = tempfile::tempdir().unwrap();
    let input = big_input(input_dir.path());
    let out_dir = tempfile::tempdir().unwrap();
    // An existing file in the folder, and (second round) an existing destination, must be
    // untouched.
    std::fs::write(out_dir.path().join("keep.txt"), b"keep").unwrap();
    let mut mid_write = 0;
    let mut kills = 0;
    for ext in ["safetensors", "npz", "pt"] {
        let out = out_dir.path().join(format!("out.{ext}"));
        for existing in [false, true] {
            if existing {
                std::fs::write(&out, b"old output").unwrap();
            }
            let before = listing(out_dir.path());
            for delay_ms in [0, 2, 10, 40] {
                let (mid, status) =
                    interrupt(&input, &out, Duration::from_millis(delay_ms), "KILL", &[]);
                kills += 1;
                if !mid {
                    // It finished first: a complete output is fine; put the folder back.
                    assert!(status.success(), "{ext}: {status}");
                    if existing {
                        std::fs::write(&out, b"old output").unwrap();
                    } else {
                        std::fs::remove_file(&out).unwrap();
                    }
                    continue;
                }
                mid_write += 1;
                assert_eq!(
                    listing(out_dir.path()),
                    before,
                    "{ext}: killed after {delay_ms} ms"
                );
                if existing {
                    assert_eq!(std::fs::read(&out).unwrap(), b"old output", "{ext}");
                }
            }
            if existing {
                std::fs::remove_file(&out).unwrap();
            }
        }
    }
    eprintln!("{mid_write} of {kills} kills landed mid-write");
    assert!(
        mid_write >= kills / 2,
        "only {mid_write} of {kills} kills landed mid-write"
    );
    assert_eq!(listing(out_dir.path()), ["keep.txt"]);
}

#[test]
fn interrupted_convert_removes_its_temporary_file() {
    let input_dir = tempfile::tempdir().unwrap();
    let input = big_input(input_dir.path());
    let out_dir = tempfile::tempdir().unwrap();
    let mut landed = 0;
    for (delay_ms, ext) in [(0, "npz"), (5, "pt"), (20, "safetensors"), (0, "pt")] {
        let out = out_dir.path().join(format!("out.{ext}"));
        // The named fallback: the only case with a file to remove.
        let (mid, status) = interrupt(
            &input,
            &out,
            Duration::from_millis(delay_ms),
            "INT",
            &[("TORCHPORT_TEST_NAMED_TEMP", "1")],
        );
        if mid {
            landed += 1;
            assert_eq!(status.code(), Some(130), "{ext}");
            assert!(listing(out_dir.path()).is_empty(), "{ext}");
        } else {
            std::fs::remove_file(&out).unwrap();
        }
    }
    assert!(landed >= 2, "only {landed} interrupts landed mid-write");
}

#[test]
fn debris_of_a_killed_named_write_is_reported_and_removed() {
    let input_dir = tempfile::tempdir().unwrap();
    let input = big_input(input_dir.path());
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.npz");
    let named = [("TORCHPORT_TEST_NAMED_TEMP", "1")];

    // Kill until one lands mid-write: a named temporary file is left.
    let killed = || {
        for delay in [0, 1, 3, 10] {
            let (mid, _) = interrupt(&input, &out, Duration::from_millis(delay), "KILL", &named);
            if mid {
                return;
            }
            std::fs::remove_file(&out).unwrap();
        }
        panic!("no kill landed mid-write");
    };
    killed();
    let left = listing(out_dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(".out.npz.tmp-"), "{left:?}");

    // The next write to that name says so and removes it once it succeeds.
    let o = convert(&[&input, &out], &[]).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("note: 1 temporary file"), "{stderr}");
    assert!(
        stderr.contains("left over from an earlier write"),
        "{stderr}"
    );
    assert!(stderr.contains("removed 1 temporary file"), "{stderr}");
    assert_eq!(listing(out_dir.path()), ["out.npz"]);

    // --clean removes debris of any name in the folder; --dry-run only says what it would.
    std::fs::remove_file(&out).unwrap();
    killed();
    let small = out_dir.path().join("small.safetensors");
    let flags = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_torchport"));
        c.args(["convert", "--include", "layer0\\.", "--clean"])
            .args(extra)
            .arg(&input)
            .arg(&small);
        c.output().unwrap()
    };
    let o = flags(&["--dry-run"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--clean would remove 1 temporary file"));
    assert_eq!(listing(out_dir.path()).len(), 1);
    let o = flags(&[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: removed 1 temporary file"),
        "{stderr}"
    );
    assert_eq!(listing(out_dir.path()), ["small.safetensors"]);
}
