//! What every CLI test uses: the repository root and the `torchport` binary.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (fixtures are under `tests/fixtures/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run the `torchport` binary with `args`, in the repository root.
pub fn torchport<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torchport"))
        .args(args.iter().map(|a| a.as_ref()))
        .current_dir(root())
        .output()
        .expect("run torchport")
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Assert the exit code, showing both streams when it differs.
pub fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

/// `torchport run MODEL --input I… --output OUT.npz` (paths relative to the repository
/// root); asserts success and returns the npz's arrays, in order.
pub fn run_model(
    model: &str,
    inputs: &[String],
) -> Vec<(String, torchport_runtime::candle_core::Tensor)> {
    let tag = Path::new(model)
        .file_stem()
        .and_then(OsStr::to_str)
        .unwrap_or("model");
    let dir = std::env::temp_dir().join(format!("torchport-run-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.npz");
    let mut args = vec!["run".to_string(), model.to_string()];
    for i in inputs {
        args.extend(["--input".to_string(), i.clone()]);
    }
    args.extend(["--output".to_string(), out.to_str().unwrap().to_string()]);
    let o = torchport(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let arrays = torchport_runtime::npy::read_arrays(&out).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    arrays
}
