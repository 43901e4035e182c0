//! Installing the fake for one test: a private copy of the built `.so` (dlopen of the same path
//! returns the same instance, so tests sharing a path would share state) with its scenario beside it.
use std::path::{Path, PathBuf};

use crate::scenario::Scenario;

/// The file name the copy gets, as the real library's SONAME.
pub const LIBRARY_NAME: &str = "libnvidia-ml.so.1";
/// The scenario file the library reads from its own directory.
pub const SCENARIO_NAME: &str = "fake-nvml.json";

/// Why the fake could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "the built fake library libfake_nvml.so is not next to the test binary (looked in {looked}); \
         add `fake-nvml` as a dev-dependency so cargo builds its cdylib"
    )]
    /// The cdylib is not where cargo puts it.
    NotBuilt {
        /// The paths tried.
        looked: String,
    },
    #[error("cannot {action} {path}: {source}")]
    /// A file operation failed.
    Io {
        /// What was being done.
        action: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError {
    let path = path.to_path_buf();
    move |source| HarnessError::Io { action, path, source }
}

/// The cdylib cargo built: `target/<profile>/deps/libfake_nvml.so` or `target/<profile>/`, found from
/// the running test binary (cargo gives tests no path to a cdylib on stable).
pub fn built_library() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(io("find", Path::new("the running test binary")))?;
    let mut looked = Vec::new();
    for dir in exe.ancestors().skip(1).take(2) {
        for candidate in [dir.join("libfake_nvml.so"), dir.join("deps").join("libfake_nvml.so")] {
            if candidate.is_file() {
                return Ok(candidate);
            }
            looked.push(candidate.display().to_string());
        }
    }
    Err(HarnessError::NotBuilt { looked: looked.join(", ") })
}

/// Copies the fake into `dir` as `libnvidia-ml.so.1`, writes `scenario` beside it, and returns the
/// library's path (for `Nvml::builder().lib_path(..)`, or `LD_LIBRARY_PATH=dir` for a subprocess).
pub fn install(dir: &Path, scenario: &Scenario) -> Result<PathBuf, HarnessError> {
    let built = built_library()?;
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let lib = dir.join(LIBRARY_NAME);
    std::fs::copy(&built, &lib).map_err(io("copy the fake library to", &lib))?;
    write_scenario(dir, scenario)?;
    Ok(lib)
}

/// Replaces the scenario in `dir` atomically (temp file + rename), so a library already loaded sees
/// either the old or the new one, and picks the new one up at its next call.
pub fn write_scenario(dir: &Path, scenario: &Scenario) -> Result<(), HarnessError> {
    let tmp = dir.join(format!(".{SCENARIO_NAME}.tmp"));
    let path = dir.join(SCENARIO_NAME);
    std::fs::write(&tmp, scenario.to_json()).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))
}
