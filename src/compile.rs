//! Stage 4 of the pipeline: **compile** rendered CUDA C++ with NVRTC.
//!
//! spec → plan → render → **compile** → cache → launch
//!
//! Our kernels are header-free CUDA C++ (no `#include` at all), so NVRTC gets
//! no include path and no headers. This module
//!
//! 1. finds `libnvrtc.so.13` itself ([`Nvrtc::discover`], order documented in
//!    `docs/nvrtc.md`), recording every place it looked (for `attnforge doctor`
//!    and for the [`CompileError::NotFound`] message);
//! 2. loads `libnvrtc.so.13` from that full path with `RTLD_NOW | RTLD_GLOBAL`,
//!    then `libnvrtc-builtins.so.<major>.<minor>` from the same folder, also
//!    `RTLD_GLOBAL`. libnvrtc `dlopen`s the builtins **by soname** when it
//!    compiles; since the builtins object is already loaded under that soname the
//!    loader hands it back instead of searching `LD_LIBRARY_PATH` (where it
//!    usually is not). Both handles live in a process-wide static and are never
//!    closed. Because libnvrtc is loaded under its soname, a later
//!    `dlopen("libnvrtc.so.13")` returns the same object
//!    ([`Nvrtc::soname_resolves_here`]); so does cudarc's lazy loader unless a
//!    different `libnvrtc.so` is on the linker path, a name cudarc tries first
//!    ([`Nvrtc::cudarc_agrees`]);
//! 3. calls NVRTC through function pointers resolved from **our** handle (typed
//!    here, error codes read as plain integers). cudarc's `nvrtc::sys` loader is
//!    never touched by compilation, so it can neither panic ("library not
//!    found") nor pick up a different `libnvrtc.so` that happens to be on the
//!    search path;
//! 4. compiles to CUBIN (with `--ptxas-options=-v`, whose output
//!    [`parse_ptxas_log`] turns into [`KernelResources`]) or to PTX, always
//!    with `--no-cache` (see [`base_options_for`]).
//!
//! Everything is thread-safe: [`Nvrtc::get`] initialises once (a `OnceLock`),
//! and each [`Nvrtc::compile`] call owns its NVRTC program, so compiles may run
//! concurrently from several threads.
//!
//! This module uses only std, libloading, cudarc (for the agreement check),
//! serde and thiserror; it is Linux-only (ELF sonames, `dladdr`).

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_LAZY, RTLD_LOCAL, RTLD_NOW};
use serde::{Deserialize, Serialize};

/// The NVRTC major version this crate is built for.
pub const NVRTC_MAJOR: i32 = 13;
/// The soname of the NVRTC library we load.
pub const NVRTC_SONAME: &str = "libnvrtc.so.13";
/// The pip requirement that provides it (used in error messages and docs).
pub const NVRTC_PIP_REQUIREMENT: &str = "nvidia-cuda-nvrtc==13.0.*";
/// How long the last-resort `python3 -c 'print(sys.path)'` probe may take.
pub const PYTHON_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Library file names accepted inside a searched folder, in order of preference.
const LIB_NAMES_IN_DIR: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];
/// Python package sub-folders that may hold NVRTC (CUDA 13 wheel layout first,
/// then the CUDA 12 era layout).
const PY_NVRTC_SUBDIRS: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"];

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Everything that can go wrong between "here is CUDA C++" and "here is a CUBIN".
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum CompileError {
    /// No usable NVRTC 13 was found. `searched` lists every candidate and why it
    /// was rejected, one line each.
    #[error(
        "NVRTC {NVRTC_MAJOR} ({NVRTC_SONAME}) not found.\n\
         Fix: `pip install {NVRTC_PIP_REQUIREMENT}` (into a site-packages searched below), \
         or `make nvrtc` in the attnforge checkout, \
         or set ATTNFORGE_NVRTC=/path/to/{NVRTC_SONAME}.\n\
         Searched:\n{}",
        bullet_list(.searched)
    )]
    NotFound {
        /// One line per candidate: where, and why it was not used.
        searched: Vec<String>,
    },

    /// A library was found (or named by `ATTNFORGE_NVRTC`) but could not be used.
    #[error("failed to load NVRTC from {}: {reason}", .path.display())]
    Load {
        /// The library file.
        path: PathBuf,
        /// What failed (dlopen error, wrong version, missing builtins, ...).
        reason: String,
    },

    /// The source did not compile (NVRTC_ERROR_COMPILATION). The rendered source
    /// was written to `source_path` when that was possible.
    #[error(
        "NVRTC failed to compile {program}{}:\n{log}",
        source_note(.source_path)
    )]
    Compilation {
        /// `CompileRequest::program_name`.
        program: String,
        /// The NVRTC program log (compiler diagnostics).
        log: String,
        /// Where the rendered source was written, if that worked.
        source_path: Option<PathBuf>,
    },

    /// An NVRTC call returned an error other than a compilation error
    /// (e.g. NVRTC_ERROR_INVALID_OPTION). `detail` holds the program log, if any.
    #[error("{call} failed: {code}{}", detail_note(.detail))]
    Nvrtc {
        /// The NVRTC function, e.g. "nvrtcCompileProgram".
        call: &'static str,
        /// The result code's name and NVRTC's description of it.
        code: String,
        /// The program log, when there is one.
        detail: String,
    },

    /// `arch` is not of the form `sm_<digits>[a|f]`.
    #[error("invalid GPU architecture {0:?}: expected e.g. sm_80, sm_86, sm_89 or sm_90a")]
    InvalidArch(String),

    /// The source, program name or an option holds a NUL byte.
    #[error("invalid NVRTC input: {what} contains a NUL byte")]
    InvalidInput {
        /// "source", "program name" or "an option".
        what: &'static str,
    },
}

fn bullet_list(lines: &[String]) -> String {
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("  - ");
        out.push_str(l);
    }
    out
}

fn source_note(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!(" (source written to {})", p.display()),
        None => String::new(),
    }
}

fn detail_note(detail: &str) -> String {
    let d = detail.trim_end();
    if d.is_empty() {
        String::new()
    } else {
        format!("\n{d}")
    }
}

// ---------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------

/// Where a candidate came from, in discovery order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Source {
    /// `ATTNFORGE_NVRTC` (a file, or a folder holding libnvrtc.so.13 / libnvrtc.so).
    /// When set it is authoritative: nothing else is searched.
    Override,
    /// `$CUDA_HOME/lib64`, `$CUDA_HOME/lib`.
    CudaHome,
    /// `$CUDA_PATH/lib64`, `$CUDA_PATH/lib`.
    CudaPath,
    /// `/usr/local/cuda/lib64`.
    UsrLocalCuda,
    /// Each folder of `LD_LIBRARY_PATH`.
    LdLibraryPath,
    /// `dlopen("libnvrtc.so.13")`: the system linker cache and default folders.
    LinkerCache,
    /// `nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib` under well-known site-packages.
    SitePackages,
    /// `$ATTNFORGE_HOME/.nvrtc/nvidia/cu13/lib` (what `make nvrtc` installs).
    ProjectLocal,
    /// Folders of `python3 -c 'import sys; print(sys.path)'` (bounded time).
    PythonSysPath,
}

impl Source {
    /// A short label for listings.
    pub const fn label(self) -> &'static str {
        match self {
            Source::Override => "ATTNFORGE_NVRTC",
            Source::CudaHome => "CUDA_HOME",
            Source::CudaPath => "CUDA_PATH",
            Source::UsrLocalCuda => "default CUDA",
            Source::LdLibraryPath => "LD_LIBRARY_PATH",
            Source::LinkerCache => "linker cache",
            Source::SitePackages => "site-packages",
            Source::ProjectLocal => "ATTNFORGE_HOME",
            Source::PythonSysPath => "python3 sys.path",
        }
    }
}

/// What was found at one candidate location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A library file exists here (not loaded yet).
    Found(PathBuf),
    /// Nothing usable here; the reason ("no such directory", "not set", ...).
    Missing(String),
    /// A library exists here but loading or checking it failed.
    Rejected {
        /// The library file that was tried.
        path: PathBuf,
        /// Why it was not used.
        reason: String,
    },
    /// This candidate was loaded and is in use.
    Loaded(PathBuf),
}

/// One place that was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Which discovery step produced it.
    pub source: Source,
    /// The folder or file looked at (empty when the variable was not set).
    pub location: PathBuf,
    /// What was found there.
    pub outcome: Outcome,
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source.label())?;
        if !self.location.as_os_str().is_empty() {
            write!(f, " {}", self.location.display())?;
        }
        match &self.outcome {
            Outcome::Found(p) => write!(f, ": found {}", p.display()),
            Outcome::Missing(r) => write!(f, ": {r}"),
            Outcome::Rejected { path, reason } => {
                write!(f, ": rejected {}: {reason}", path.display())
            }
            Outcome::Loaded(p) => write!(f, ": loaded {}", p.display()),
        }
    }
}

/// The result of a full search (see [`Nvrtc::discover`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Every candidate, in search order.
    pub candidates: Vec<Candidate>,
}

impl Discovery {
    /// The first library file found, i.e. the one [`Nvrtc::get`] would try first.
    pub fn first_found(&self) -> Option<&Path> {
        self.candidates.iter().find_map(|c| match &c.outcome {
            Outcome::Found(p) | Outcome::Loaded(p) => Some(p.as_path()),
            _ => None,
        })
    }

    /// Every candidate as one human-readable line.
    pub fn searched(&self) -> Vec<String> {
        self.candidates.iter().map(|c| c.to_string()).collect()
    }
}

/// The inputs of discovery, separated from the process so tests can use temp dirs.
#[derive(Debug, Clone, Default)]
struct SearchEnv {
    attnforge_nvrtc: Option<PathBuf>,
    cuda_home: Option<PathBuf>,
    cuda_path: Option<PathBuf>,
    ld_library_path: Option<OsString>,
    virtual_env: Option<PathBuf>,
    home: Option<PathBuf>,
    attnforge_home: Option<PathBuf>,
    /// Prefix of the system folders (/usr/local/cuda, /usr/lib, /opt, ...): "/" normally.
    root: PathBuf,
    /// Probe `dlopen("libnvrtc.so.13")`.
    linker_cache: bool,
    /// Interpreter asked for `sys.path` last (None: skip that step).
    python: Option<OsString>,
    python_timeout: Duration,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

impl SearchEnv {
    fn from_process() -> SearchEnv {
        SearchEnv {
            attnforge_nvrtc: env_path("ATTNFORGE_NVRTC"),
            cuda_home: env_path("CUDA_HOME"),
            cuda_path: env_path("CUDA_PATH"),
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()),
            virtual_env: env_path("VIRTUAL_ENV"),
            home: env_path("HOME"),
            attnforge_home: env_path("ATTNFORGE_HOME"),
            root: PathBuf::from("/"),
            linker_cache: true,
            python: Some(OsString::from("python3")),
            python_timeout: PYTHON_PROBE_TIMEOUT,
        }
    }
}

/// Looks for the NVRTC library inside one folder.
fn lib_in_dir(dir: &Path) -> Outcome {
    if !dir.is_dir() {
        return Outcome::Missing("no such directory".into());
    }
    for name in LIB_NAMES_IN_DIR {
        let p = dir.join(name);
        if p.is_file() {
            return Outcome::Found(p);
        }
    }
    // Say what *is* there (e.g. a CUDA 12 libnvrtc.so.12), it helps `doctor`.
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("libnvrtc.so."))
        .collect();
    others.sort();
    if others.is_empty() {
        Outcome::Missing(format!("no {} here", LIB_NAMES_IN_DIR.join(" or ")))
    } else {
        Outcome::Missing(format!("only {} here; need {NVRTC_SONAME}", others.join(", ")))
    }
}

/// Sub-entries of `dir` whose names start with "python3", newest version first.
fn python_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix("python3")?;
            // "python3", "python3.12"; not "python3.12-config" or similar files.
            let ver: Option<Vec<u32>> = std::iter::once("3")
                .chain(rest.strip_prefix('.').unwrap_or(rest).split('.'))
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().ok())
                .collect();
            let ver = ver?;
            let path = e.path();
            path.is_dir().then_some((ver, path))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The fixed list of site-packages patterns (step 5), expanded.
/// Returns (pattern shown to the user, matching site dirs).
fn site_packages(env: &SearchEnv) -> Vec<(String, Vec<PathBuf>)> {
    let mut bases: Vec<(PathBuf, &[&str])> = Vec::new();
    const SITE: &[&str] = &["site-packages"];
    const SITE_DIST: &[&str] = &["site-packages", "dist-packages"];
    if let Some(v) = &env.virtual_env {
        bases.push((v.join("lib"), SITE));
    }
    if let Some(h) = &env.home {
        bases.push((h.join(".local/lib"), SITE));
    }
    bases.push((env.root.join("usr/local/lib"), SITE_DIST));
    bases.push((env.root.join("usr/lib"), SITE_DIST));
    // /opt/*/.venv/lib
    let mut opt: Vec<PathBuf> = std::fs::read_dir(env.root.join("opt"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(".venv/lib"))
        .filter(|p| p.is_dir())
        .collect();
    opt.sort();
    let opt_pattern = env.root.join("opt/*/.venv/lib");

    let mut out = Vec::new();
    let mut expand = |pattern_base: &Path, libs: &[PathBuf], kinds: &[&str]| {
        for kind in kinds {
            let pattern = format!("{}/python3*/{kind}", pattern_base.display());
            let dirs: Vec<PathBuf> = libs
                .iter()
                .flat_map(|l| python_dirs(l))
                .map(|p| p.join(kind))
                .filter(|p| p.is_dir())
                .collect();
            out.push((pattern, dirs));
        }
    };
    for (base, kinds) in &bases {
        expand(base, std::slice::from_ref(base), kinds);
    }
    expand(&opt_pattern, &opt, SITE);
    out
}

/// Runs `python -c 'import sys; print("\n".join(sys.path))'` with a deadline.
fn python_sys_path(python: &OsStr, timeout: Duration) -> Result<Vec<PathBuf>, String> {
    let mut child = Command::new(python)
        .args(["-c", "import sys; print('\\n'.join(sys.path))"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", python.to_string_lossy()))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("wait failed: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut so) = child.stdout.take() {
        so.read_to_string(&mut out)
            .map_err(|e| format!("reading its output failed: {e}"))?;
    }
    if !status.success() {
        return Err(format!("exited with {status}"));
    }
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// Walks the candidates in discovery order, calling `visit` for each one until it
/// returns `Break`. Folders already visited (same canonical path) are skipped.
fn search(env: &SearchEnv, mut visit: impl FnMut(Candidate) -> ControlFlow<()>) {
    type Visit<'v> = &'v mut dyn FnMut(Candidate) -> ControlFlow<()>;
    let seen = std::cell::RefCell::new(HashSet::<PathBuf>::new());
    // First visit of this folder (by canonical path)?
    let first_visit = |p: &Path| {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        seen.borrow_mut().insert(key)
    };
    // One library folder. Returns Break when the visitor wants to stop.
    let dir = |source: Source, dir: PathBuf, visit: Visit| {
        if !first_visit(&dir) {
            return ControlFlow::Continue(());
        }
        let outcome = lib_in_dir(&dir);
        visit(Candidate {
            source,
            location: dir,
            outcome,
        })
    };
    // One site-packages folder: its nvidia/cu13/lib and nvidia/cuda_nvrtc/lib.
    let site_dir = |source: Source, site: PathBuf, visit: Visit| {
        if !first_visit(&site) {
            return ControlFlow::Continue(());
        }
        if !site.join("nvidia").is_dir() {
            return visit(Candidate {
                source,
                location: site,
                outcome: Outcome::Missing("no nvidia/ package here".into()),
            });
        }
        for sub in PY_NVRTC_SUBDIRS {
            dir(source, site.join(sub), &mut *visit)?;
        }
        ControlFlow::Continue(())
    };
    let unset = |source: Source| Candidate {
        source,
        location: PathBuf::new(),
        outcome: Outcome::Missing("not set".into()),
    };
    macro_rules! step {
        ($e:expr) => {
            if let ControlFlow::Break(()) = $e {
                return;
            }
        };
    }

    // 1. ATTNFORGE_NVRTC: authoritative when set.
    if let Some(p) = &env.attnforge_nvrtc {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let outcome = if p.is_dir() {
            // A lib folder, or a `pip install --target` folder.
            match lib_in_dir(&p) {
                Outcome::Missing(why) => match lib_in_dir(&p.join("nvidia/cu13/lib")) {
                    found @ Outcome::Found(_) => found,
                    Outcome::Missing(_) | Outcome::Rejected { .. } | Outcome::Loaded(_) => Outcome::Missing(why),
                },
                other => other,
            }
        } else if p.is_file() {
            Outcome::Found(p.clone())
        } else {
            Outcome::Missing("does not exist (ATTNFORGE_NVRTC is authoritative: nothing else is searched)".into())
        };
        let _ = visit(Candidate {
            source: Source::Override,
            location: p,
            outcome,
        });
        return;
    }
    step!(visit(unset(Source::Override)));

    // 2. CUDA_HOME, CUDA_PATH.
    for (source, value) in [(Source::CudaHome, &env.cuda_home), (Source::CudaPath, &env.cuda_path)] {
        match value {
            Some(x) => {
                step!(dir(source, x.join("lib64"), &mut visit));
                step!(dir(source, x.join("lib"), &mut visit));
            }
            None => step!(visit(unset(source))),
        }
    }

    // 3. /usr/local/cuda/lib64.
    step!(dir(
        Source::UsrLocalCuda,
        env.root.join("usr/local/cuda/lib64"),
        &mut visit
    ));

    // 4. LD_LIBRARY_PATH, then the linker's own search for the soname.
    match &env.ld_library_path {
        Some(lp) => {
            for d in std::env::split_paths(lp).filter(|d| !d.as_os_str().is_empty()) {
                step!(dir(Source::LdLibraryPath, d, &mut visit));
            }
        }
        None => step!(visit(unset(Source::LdLibraryPath))),
    }
    if env.linker_cache {
        let outcome = match probe_soname(NVRTC_SONAME) {
            Ok(p) => Outcome::Found(p),
            Err(e) => Outcome::Missing(e),
        };
        step!(visit(Candidate {
            source: Source::LinkerCache,
            location: PathBuf::from(NVRTC_SONAME),
            outcome,
        }));
    }

    // 5. Well-known site-packages.
    for (pattern, sites) in site_packages(env) {
        if sites.is_empty() {
            step!(visit(Candidate {
                source: Source::SitePackages,
                location: PathBuf::from(pattern),
                outcome: Outcome::Missing("no match".into()),
            }));
        }
        for site in sites {
            step!(site_dir(Source::SitePackages, site, &mut visit));
        }
    }

    // 6. Project-local install (`make nvrtc`).
    match &env.attnforge_home {
        Some(h) => step!(dir(Source::ProjectLocal, h.join(".nvrtc/nvidia/cu13/lib"), &mut visit)),
        None => step!(visit(unset(Source::ProjectLocal))),
    }

    // Last (it spawns a process): the interpreter's own sys.path.
    if let Some(py) = &env.python {
        match python_sys_path(py, env.python_timeout) {
            Ok(paths) => {
                for site in paths.into_iter().filter(|p| p.is_dir()) {
                    step!(site_dir(Source::PythonSysPath, site, &mut visit));
                }
            }
            Err(e) => step!(visit(Candidate {
                source: Source::PythonSysPath,
                location: PathBuf::from(py),
                outcome: Outcome::Missing(e),
            })),
        }
    }
}

/// The first library file discovery would try, found with `stat` calls only
/// (no loading) when it is in a folder; stops at the first hit. Used to key
/// the NVRTC version memo without loading NVRTC on a cache hit.
pub fn locate_first() -> Option<PathBuf> {
    let mut found = None;
    search(&SearchEnv::from_process(), |c| match c.outcome {
        Outcome::Found(p) | Outcome::Loaded(p) => {
            found = Some(p);
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    });
    found
}

fn discover_in(env: &SearchEnv) -> Discovery {
    let mut candidates = Vec::new();
    search(env, |c| {
        candidates.push(c);
        ControlFlow::Continue(())
    });
    Discovery { candidates }
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

/// glibc's RTLD_NOLOAD (not exported by libloading).
const RTLD_NOLOAD: c_int = 0x0004;

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

extern "C" {
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// The file that holds the code at `addr`, as the dynamic loader knows it.
fn object_path_of(addr: *const c_void) -> Option<PathBuf> {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the address and fills `info`.
    let ok = unsafe { dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(OsStr::from_bytes(name.to_bytes()));
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Address of `symbol` in `lib`.
fn symbol_addr(lib: &Library, symbol: &str) -> Result<*const c_void, String> {
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: we only take the address; nothing is called.
    unsafe { lib.get::<*const c_void>(&name) }
        .map(|s| s.into_raw() as *const c_void)
        .map_err(|e| format!("symbol {symbol} missing: {e}"))
}

/// Where `dlopen(soname)` resolves, without keeping the library loaded.
fn probe_soname(soname: &str) -> Result<PathBuf, String> {
    // SAFETY: loading NVRTC runs only its (benign) initialisers.
    let lib =
        unsafe { Library::open(Some(soname), RTLD_LAZY | RTLD_LOCAL) }.map_err(|e| format!("dlopen failed: {e}"))?;
    let addr = symbol_addr(&lib, "nvrtcVersion")?;
    object_path_of(addr).ok_or_else(|| "dladdr found no file for nvrtcVersion".to_string())
}

type Program = *mut c_void;
type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type FnCreate = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type FnDestroy = unsafe extern "C" fn(*mut Program) -> c_int;
type FnCompile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type FnSize = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type FnFill = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type FnErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// NVRTC entry points resolved from our own handle. Error codes are read as
/// `c_int` (the C enum's ABI), so an unknown code is never undefined behaviour.
#[derive(Clone, Copy)]
struct Api {
    version: FnVersion,
    create: FnCreate,
    destroy: FnDestroy,
    compile: FnCompile,
    log_size: FnSize,
    log: FnFill,
    cubin_size: FnSize,
    cubin: FnFill,
    ptx_size: FnSize,
    ptx: FnFill,
    error_string: FnErrorString,
}

impl Api {
    fn resolve(lib: &Library) -> Result<Api, String> {
        /// SAFETY (of callers): T must be the C signature of `name`.
        unsafe fn get<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
            let mut n = name.as_bytes().to_vec();
            n.push(0);
            lib.get::<T>(&n)
                .map(|s| *s)
                .map_err(|e| format!("symbol {name} missing: {e}"))
        }
        // SAFETY: the types above are the documented NVRTC signatures.
        unsafe {
            Ok(Api {
                version: get(lib, "nvrtcVersion")?,
                create: get(lib, "nvrtcCreateProgram")?,
                destroy: get(lib, "nvrtcDestroyProgram")?,
                compile: get(lib, "nvrtcCompileProgram")?,
                log_size: get(lib, "nvrtcGetProgramLogSize")?,
                log: get(lib, "nvrtcGetProgramLog")?,
                cubin_size: get(lib, "nvrtcGetCUBINSize")?,
                cubin: get(lib, "nvrtcGetCUBIN")?,
                ptx_size: get(lib, "nvrtcGetPTXSize")?,
                ptx: get(lib, "nvrtcGetPTX")?,
                error_string: get(lib, "nvrtcGetErrorString")?,
            })
        }
    }
}

/// Time spent making NVRTC usable (see [`Nvrtc::timings`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadTimings {
    /// Walking the candidates up to (not including) loading the winner.
    pub search: Duration,
    /// `dlopen` of libnvrtc (RTLD_NOW | RTLD_GLOBAL), plus symbol resolution.
    pub dlopen_nvrtc: Duration,
    /// `dlopen` of libnvrtc-builtins.
    pub dlopen_builtins: Duration,
    /// Everything inside [`Nvrtc::get`]'s first call.
    pub total: Duration,
}

/// A loaded NVRTC 13. Obtain it with [`Nvrtc::get`]; it lives for the process.
pub struct Nvrtc {
    path: PathBuf,
    builtins_path: PathBuf,
    version: (i32, i32),
    api: Api,
    timings: LoadTimings,
    tried: Vec<Candidate>,
    // Kept open for the life of the process (the value lives in a static).
    _nvrtc: Library,
    _builtins: Library,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("builtins_path", &self.builtins_path)
            .field("version", &self.version)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

static NVRTC: OnceLock<Result<Nvrtc, CompileError>> = OnceLock::new();

/// Loads libnvrtc from `path` and its builtins from the same folder.
fn load_from(path: &Path) -> Result<(Nvrtc, Duration, Duration), String> {
    let t0 = Instant::now();
    // SAFETY: NVRTC's initialisers are benign; the handle is kept (never closed)
    // once the candidate is accepted.
    let nvrtc =
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| format!("dlopen failed: {e}"))?;
    let api = Api::resolve(&nvrtc)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints.
    let rc = unsafe { (api.version)(&mut major, &mut minor) };
    if rc != 0 {
        return Err(format!("nvrtcVersion returned {}", result_name(rc)));
    }
    if major != NVRTC_MAJOR {
        return Err(format!("NVRTC {major}.{minor}; attnforge needs {NVRTC_MAJOR}.x"));
    }
    let t_nvrtc = t0.elapsed();

    // libnvrtc dlopen()s "libnvrtc-builtins.so.<major>.<minor>" by soname when
    // it compiles. Pre-load that exact file from the same folder, RTLD_GLOBAL,
    // so the loader finds it already resident.
    let t1 = Instant::now();
    let builtins_name = format!("libnvrtc-builtins.so.{major}.{minor}");
    let dir = path.parent().unwrap_or(Path::new("/"));
    let local = dir.join(&builtins_name);
    let builtins_target: &OsStr = if local.is_file() {
        local.as_os_str()
    } else {
        // A system install may keep it elsewhere on the linker path.
        OsStr::new(&builtins_name)
    };
    // SAFETY: as above.
    let builtins = unsafe { Library::open(Some(builtins_target), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        format!(
            "{builtins_name} not found next to it ({}) nor on the linker path: {e}",
            dir.display()
        )
    })?;
    let builtins_path = symbol_addr(&builtins, &format!("__nvrtc_builtins__{major}_{minor}_getArchBuiltins"))
        .ok()
        .and_then(object_path_of)
        .unwrap_or_else(|| {
            if local.is_file() {
                local.clone()
            } else {
                PathBuf::from(&builtins_name)
            }
        });
    let t_builtins = t1.elapsed();

    let real_path = symbol_addr(&nvrtc, "nvrtcVersion")
        .ok()
        .and_then(object_path_of)
        .unwrap_or_else(|| path.to_path_buf());
    Ok((
        Nvrtc {
            path: real_path,
            builtins_path,
            version: (major, minor),
            api,
            timings: LoadTimings::default(),
            tried: Vec::new(),
            _nvrtc: nvrtc,
            _builtins: builtins,
        },
        t_nvrtc,
        t_builtins,
    ))
}

fn init(env: &SearchEnv) -> Result<Nvrtc, CompileError> {
    let t0 = Instant::now();
    let mut tried: Vec<Candidate> = Vec::new();
    let mut loaded: Option<(Nvrtc, Duration, Duration)> = None;
    let mut override_failure: Option<CompileError> = None;
    search(env, |mut c| {
        if let Outcome::Found(path) = &c.outcome {
            let path = path.clone();
            match load_from(&path) {
                Ok(l) => {
                    c.outcome = Outcome::Loaded(l.0.path.clone());
                    loaded = Some(l);
                    tried.push(c);
                    return ControlFlow::Break(());
                }
                Err(reason) => {
                    if c.source == Source::Override {
                        override_failure = Some(CompileError::Load {
                            path: path.clone(),
                            reason: reason.clone(),
                        });
                    }
                    c.outcome = Outcome::Rejected { path, reason };
                }
            }
        }
        tried.push(c);
        ControlFlow::Continue(())
    });
    match loaded {
        Some((mut nv, t_nvrtc, t_builtins)) => {
            let total = t0.elapsed();
            nv.timings = LoadTimings {
                search: total.saturating_sub(t_nvrtc + t_builtins),
                dlopen_nvrtc: t_nvrtc,
                dlopen_builtins: t_builtins,
                total,
            };
            nv.tried = tried;
            Ok(nv)
        }
        None => Err(override_failure.unwrap_or_else(|| CompileError::NotFound {
            searched: tried.iter().map(|c| c.to_string()).collect(),
        })),
    }
}

impl Nvrtc {
    /// Discovers and loads NVRTC once per process; later calls are a load of an
    /// atomic. A failure is also remembered (the environment is read once).
    pub fn get() -> Result<&'static Nvrtc, CompileError> {
        NVRTC
            .get_or_init(|| init(&SearchEnv::from_process()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Lists every candidate location in search order and what is there,
    /// without loading NVRTC (the linker-cache step `dlopen`s the soname to
    /// learn its path and closes it again; the last step runs `python3`).
    /// For `attnforge doctor`.
    pub fn discover() -> Discovery {
        discover_in(&SearchEnv::from_process())
    }

    /// NVRTC's (major, minor), e.g. (13, 0).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// "13.0".
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version.0, self.version.1)
    }

    /// The libnvrtc file in use (canonical path, as the loader reports it).
    pub fn library_path(&self) -> &Path {
        &self.path
    }

    /// The libnvrtc-builtins file in use.
    pub fn builtins_path(&self) -> &Path {
        &self.builtins_path
    }

    /// How long discovery and loading took.
    pub fn timings(&self) -> LoadTimings {
        self.timings
    }

    /// The candidates tried before (and including) the one that was loaded.
    pub fn tried(&self) -> &[Candidate] {
        &self.tried
    }

    /// Whether `dlopen("libnvrtc.so.13")` now resolves to our library (the
    /// soname trick). Cheap: RTLD_NOLOAD, nothing new is loaded.
    pub fn soname_resolves_here(&self) -> bool {
        // SAFETY: RTLD_NOLOAD never loads anything.
        let Ok(lib) = (unsafe { Library::open(Some(NVRTC_SONAME), RTLD_NOW | RTLD_NOLOAD) }) else {
            return false;
        };
        symbol_addr(&lib, "nvrtcVersion").ok() == Some(self.api.version as *const c_void)
    }

    /// Whether cudarc's own NVRTC loader (`cudarc::nvrtc::sys`) resolves to the
    /// library we loaded, by comparing `nvrtcVersion` addresses. cudarc tries
    /// `libnvrtc.so` before `libnvrtc.so.13`, so a different `libnvrtc.so` on the
    /// linker path would win there; this detects that (for `doctor`). Calling it
    /// makes cudarc load its library; it cannot panic, because our soname is
    /// loaded and therefore always resolvable.
    pub fn cudarc_agrees(&self) -> bool {
        // SAFETY: culib() only dlopens by name; with libnvrtc.so.13 resident it
        // always finds something.
        let lib = unsafe { cudarc::nvrtc::sys::culib() };
        // SAFETY: we only take the address.
        let theirs = unsafe { lib.get::<*const c_void>(b"nvrtcVersion\0") }.map(|s| *s).ok();
        theirs == Some(self.api.version as *const c_void)
    }

    fn check(&self, call: &'static str, rc: c_int, prog: Program) -> Result<(), CompileError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string (or null).
        let msg = unsafe { (self.api.error_string)(rc) };
        let mut code = result_name(rc);
        if !msg.is_null() {
            // SAFETY: NUL-terminated static string.
            let s = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
            if s != code {
                code = format!("{code} ({s})");
            }
        }
        let detail = if prog.is_null() {
            String::new()
        } else {
            self.program_log(prog).unwrap_or_default()
        };
        Err(CompileError::Nvrtc { call, code, detail })
    }

    fn program_log(&self, prog: Program) -> Result<String, CompileError> {
        let mut size = 0usize;
        // SAFETY: valid program, out-pointer to a usize.
        let rc = unsafe { (self.api.log_size)(prog, &mut size) };
        if rc != 0 {
            return Err(CompileError::Nvrtc {
                call: "nvrtcGetProgramLogSize",
                code: result_name(rc),
                detail: String::new(),
            });
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: buf holds `size` bytes as NVRTC asked.
        let rc = unsafe { (self.api.log)(prog, buf.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(CompileError::Nvrtc {
                call: "nvrtcGetProgramLog",
                code: result_name(rc),
                detail: String::new(),
            });
        }
        while buf.last() == Some(&0) {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn output(
        &self,
        prog: Program,
        size_fn: (FnSize, &'static str),
        fill_fn: (FnFill, &'static str),
    ) -> Result<Vec<u8>, CompileError> {
        let mut size = 0usize;
        // SAFETY: valid program, out-pointer to a usize.
        let rc = unsafe { (size_fn.0)(prog, &mut size) };
        self.check(size_fn.1, rc, prog)?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: buf holds `size` bytes as NVRTC asked.
            let rc = unsafe { (fill_fn.0)(prog, buf.as_mut_ptr().cast()) };
            self.check(fill_fn.1, rc, prog)?;
        }
        Ok(buf)
    }

    /// Compiles one program. Options passed to NVRTC are exactly
    /// [`CompileRequest::effective_options`]: [`base_options_for`] followed by
    /// `req.options`, in that order.
    pub fn compile(&self, req: &CompileRequest) -> Result<CompileOutput, CompileError> {
        let t0 = Instant::now();
        parse_arch(req.arch)?;
        let src = CString::new(req.source).map_err(|_| CompileError::InvalidInput { what: "source" })?;
        let name = CString::new(req.program_name).map_err(|_| CompileError::InvalidInput { what: "program name" })?;
        let opts: Vec<CString> = req
            .effective_options()
            .into_iter()
            .map(|o| CString::new(o).map_err(|_| CompileError::InvalidInput { what: "an option" }))
            .collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        let rc = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", rc, std::ptr::null_mut())?;
        let guard = ProgramGuard {
            prog,
            destroy: self.api.destroy,
        };

        let n = c_int::try_from(opt_ptrs.len()).unwrap_or(c_int::MAX);
        // SAFETY: `n` valid option strings that outlive the call.
        let rc = unsafe { (self.api.compile)(guard.prog, n, opt_ptrs.as_ptr()) };
        if rc == NVRTC_ERROR_COMPILATION {
            let log = self.program_log(guard.prog)?;
            drop(guard);
            return Err(CompileError::Compilation {
                program: req.program_name.to_string(),
                log,
                source_path: write_failed_source(req.program_name, req.source),
            });
        }
        self.check("nvrtcCompileProgram", rc, guard.prog)?;
        let log = self.program_log(guard.prog)?;

        let (binary, resources) = match req.emit {
            Emit::Cubin => {
                let bin = self.output(
                    guard.prog,
                    (self.api.cubin_size, "nvrtcGetCUBINSize"),
                    (self.api.cubin, "nvrtcGetCUBIN"),
                )?;
                (bin, parse_ptxas_log(&log))
            }
            Emit::Ptx => {
                let mut bin = self.output(
                    guard.prog,
                    (self.api.ptx_size, "nvrtcGetPTXSize"),
                    (self.api.ptx, "nvrtcGetPTX"),
                )?;
                while bin.last() == Some(&0) {
                    bin.pop();
                }
                (bin, Vec::new())
            }
        };
        drop(guard);
        Ok(CompileOutput {
            binary,
            log,
            resources,
            elapsed: t0.elapsed(),
        })
    }
}

/// Destroys the NVRTC program on every exit path.
struct ProgramGuard {
    prog: Program,
    destroy: FnDestroy,
}

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        if !self.prog.is_null() {
            // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
            unsafe { (self.destroy)(&mut self.prog) };
        }
    }
}

const NVRTC_ERROR_COMPILATION: c_int = 6;

/// The symbolic name of an nvrtcResult code.
fn result_name(rc: c_int) -> String {
    const NAMES: [&str; 19] = [
        "NVRTC_SUCCESS",
        "NVRTC_ERROR_OUT_OF_MEMORY",
        "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        "NVRTC_ERROR_INVALID_INPUT",
        "NVRTC_ERROR_INVALID_PROGRAM",
        "NVRTC_ERROR_INVALID_OPTION",
        "NVRTC_ERROR_COMPILATION",
        "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
        "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        "NVRTC_ERROR_INTERNAL_ERROR",
        "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
        "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
        "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
        "NVRTC_ERROR_PCH_CREATE",
        "NVRTC_ERROR_CANCELLED",
        "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
        "NVRTC_ERROR_BUSY",
    ];
    match usize::try_from(rc).ok().and_then(|i| NAMES.get(i)) {
        Some(n) => (*n).to_string(),
        None => format!("nvrtcResult {rc}"),
    }
}

/// Writes a source that failed to compile to `temp_dir()/attnforge-failed/<name>`.
fn write_failed_source(program_name: &str, source: &str) -> Option<PathBuf> {
    let dir = std::env::temp_dir().join("attnforge-failed");
    std::fs::create_dir_all(&dir).ok()?;
    // Only the file name, and only tame characters: never escape the folder.
    let base = Path::new(program_name)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        safe = "program.cu".into();
    }
    let path = dir.join(safe);
    std::fs::write(&path, source).ok()?;
    Some(path)
}

// ---------------------------------------------------------------------------
// Requests, options, outputs
// ---------------------------------------------------------------------------

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Emit {
    /// SASS for exactly `arch` (`--gpu-architecture=sm_XX`), with ptxas resource usage.
    Cubin,
    /// PTX text for the virtual arch (`--gpu-architecture=compute_XX`).
    Ptx,
}

/// One compilation.
#[derive(Debug, Clone, Copy)]
pub struct CompileRequest<'a> {
    /// Header-free CUDA C++.
    pub source: &'a str,
    /// Shown in diagnostics, e.g. "fwd_bf16_d128.cu".
    pub program_name: &'a str,
    /// "sm_80" | "sm_86" | "sm_89" | "sm_90a" (any `sm_<n>[a|f]`).
    pub arch: &'a str,
    /// Extra options, appended after [`base_options_for`] in this order.
    pub options: &'a [String],
    /// CUBIN (default) or PTX.
    pub emit: Emit,
}

impl<'a> CompileRequest<'a> {
    /// A CUBIN request with no extra options.
    pub fn new(source: &'a str, program_name: &'a str, arch: &'a str) -> Self {
        CompileRequest {
            source,
            program_name,
            arch,
            options: &[],
            emit: Emit::Cubin,
        }
    }

    /// The exact option list handed to NVRTC, in order (hash this for cache keys).
    pub fn effective_options(&self) -> Vec<String> {
        let mut v = base_options_for(self.arch, self.emit);
        v.extend(self.options.iter().cloned());
        v
    }
}

/// Register / memory usage of one kernel, from ptxas `-v`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelResources {
    /// The entry (kernel) name as ptxas prints it (unmangled for `extern "C"`).
    pub entry: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame per thread.
    pub stack_frame: u32,
    /// Bytes of spill stores per thread.
    pub spill_stores: u32,
    /// Bytes of spill loads per thread.
    pub spill_loads: u32,
    /// Bytes of static shared memory (`__shared__` arrays), not dynamic.
    pub smem_static: u32,
    /// Bytes of constant bank 0 (kernel parameters and driver data).
    pub cmem0: u32,
}

/// The result of a successful compile.
#[derive(Debug, Clone)]
pub struct CompileOutput {
    /// CUBIN (ELF) bytes, or PTX text without the terminating NUL.
    pub binary: Vec<u8>,
    /// The full NVRTC program log (ptxas `-v` output for CUBIN, warnings).
    pub log: String,
    /// Per-kernel resources (CUBIN only; empty for PTX).
    pub resources: Vec<KernelResources>,
    /// Wall time of [`Nvrtc::compile`].
    pub elapsed: Duration,
}

/// Splits "sm_90a" into (90, "a").
fn parse_arch(arch: &str) -> Result<(u32, &str), CompileError> {
    let bad = || CompileError::InvalidArch(arch.to_string());
    let rest = arch.strip_prefix("sm_").ok_or_else(bad)?;
    let digits_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (num, suffix) = rest.split_at(digits_end);
    if num.len() < 2 || num.len() > 3 || !matches!(suffix, "" | "a" | "f") {
        return Err(bad());
    }
    Ok((num.parse().map_err(|_| bad())?, suffix))
}

/// The fixed options for a CUBIN build (see [`base_options_for`]).
pub fn base_options(arch: &str) -> Vec<String> {
    base_options_for(arch, Emit::Cubin)
}

/// The options always passed, in this fixed order:
///
/// 1. `--gpu-architecture=sm_XX` (CUBIN) or `=compute_XX` (PTX; `compute_90a`
///    for `sm_90a`): real SASS for exactly that GPU / PTX for that virtual arch.
/// 2. `-std=c++17`: pinned so a future NVRTC default cannot change the dialect.
/// 3. `-default-device`: functions without `__host__`/`__device__` are device
///    functions, so header-free helpers need no annotations.
/// 4. `--no-cache`: turn off NVRTC's own result cache (CUDA 12.9+, in the
///    driver's compute cache, active whenever libcuda is present). On a hit
///    NVRTC skips ptxas, so the log has no `-v` lines and the resources would
///    be lost (seen on the H200: an empty log on the second compile of the same
///    source). attnforge has its own cache; a lookup also initialises the
///    driver inside NVRTC.
/// 5. `--ptxas-options=-v` (CUBIN only): ptxas writes per-kernel registers,
///    spills, stack, smem and cmem into the log → [`parse_ptxas_log`].
///
/// Deliberately absent: `--use_fast_math` (kernels use explicit approximate PTX
/// such as `ex2.approx` where wanted), `-lineinfo`/`-G` (debug only; pass them
/// in `CompileRequest::options`), include paths (sources are header-free).
pub fn base_options_for(arch: &str, emit: Emit) -> Vec<String> {
    let gpu = match emit {
        Emit::Cubin => arch.to_string(),
        Emit::Ptx => match arch.strip_prefix("sm_") {
            Some(rest) => format!("compute_{rest}"),
            None => arch.to_string(),
        },
    };
    let mut v = vec![
        format!("--gpu-architecture={gpu}"),
        "-std=c++17".to_string(),
        "-default-device".to_string(),
        "--no-cache".to_string(),
    ];
    if emit == Emit::Cubin {
        v.push("--ptxas-options=-v".to_string());
    }
    v
}

/// Splits a ptxas field such as "ptxas .  376 bytes stack frame" into its
/// first number and the words after it.
fn number_and_words(part: &str) -> Option<(u32, Vec<&str>)> {
    let mut words = part.split_whitespace();
    let n = words
        .find(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()?;
    Some((n, words.collect()))
}

/// Whether ptxas serialized a kernel's wgmma instructions (its warnings
/// C7510..C7515 in the compile log: every `wgmma.mma_async` then waits for
/// the previous one, which costs an sm90a forward 10-40% without any spill
/// to show it).
pub fn wgmma_serialized(log: &str) -> bool {
    log.contains("wgmma.mma_async instructions are serialized")
}

/// Parses ptxas `-v` output (as found in the NVRTC log) into one record per
/// entry function, in the order ptxas reports them. Non-entry functions
/// ("Function properties for" a `__noinline__` device function) are ignored;
/// unknown lines are skipped, so warnings interleaved in the log are harmless.
///
/// The lines it reads (NVRTC 13.0):
///
/// ```text
/// ptxas info    : Compiling entry function 'spiller' for 'sm_80'
/// ptxas info    : Function properties for spiller
/// ptxas         .     376 bytes stack frame, 372 bytes spill stores, 556 bytes spill loads
/// ptxas info    : Used 24 registers, used 0 barriers, 512 bytes smem, 372 bytes cmem[0]
/// ```
///
/// Fields ptxas leaves out (sm_90 prints no `cmem[0]`, kernels without
/// `__shared__` print no `smem`) are 0.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    // Index into `out` of the entry being compiled (the target of "Used ...").
    let mut current: Option<usize> = None;
    // Index into `out` named by the last "Function properties for X" line, if X
    // is an entry.
    let mut props_for: Option<usize> = None;

    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("");
            let idx = match out.iter().position(|k| k.entry == name) {
                Some(i) => i,
                None => {
                    out.push(KernelResources {
                        entry: name.to_string(),
                        ..KernelResources::default()
                    });
                    out.len() - 1
                }
            };
            current = Some(idx);
            props_for = None;
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            let name = rest.trim().trim_matches('\'');
            props_for = out.iter().position(|k| k.entry == name);
        } else if line.contains("bytes stack frame") {
            let Some(i) = props_for.take() else { continue };
            for (n, what) in line.split(',').filter_map(number_and_words) {
                match what.as_slice() {
                    ["bytes", "stack", "frame", ..] => out[i].stack_frame = n,
                    ["bytes", "spill", "stores", ..] => out[i].spill_stores = n,
                    ["bytes", "spill", "loads", ..] => out[i].spill_loads = n,
                    _ => {}
                }
            }
        } else if let Some(rest) = line.split(": Used ").nth(1) {
            let Some(i) = current else { continue };
            for (n, what) in rest.split(',').filter_map(number_and_words) {
                match what.as_slice() {
                    ["registers", ..] => out[i].registers = n,
                    ["bytes", "smem", ..] => out[i].smem_static = n,
                    ["bytes", "cmem[0]", ..] => out[i].cmem0 = n,
                    _ => {}
                }
            }
        }
    }
    out
}

/// The parameters each entry of a CUBIN takes: (entry name, the size in bytes
/// of each parameter in order), read from the ELF's `.nv.info.<entry>`
/// sections (their `EIATTR_KPARAM_INFO` records, which the driver answers
/// `cuFuncGetParamInfo` from). `None` where the image is not a 64-bit
/// little-endian ELF or a section does not parse; entries in section order.
pub fn cubin_params(cubin: &[u8]) -> Option<Vec<(String, Vec<usize>)>> {
    const EIFMT_SVAL: u8 = 4;
    const EIATTR_KPARAM_INFO: u8 = 0x17;
    let u16_at = |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    if cubin.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(cubin, 0x28)?).ok()?;
    let (shentsize, shnum, shstrndx) = (
        usize::from(u16_at(cubin, 0x3a)?),
        usize::from(u16_at(cubin, 0x3c)?),
        usize::from(u16_at(cubin, 0x3e)?),
    );
    // (name offset, file offset, size) of section i.
    let section = |i: usize| -> Option<(usize, usize, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(cubin, h)? as usize,
            usize::try_from(u64_at(cubin, h + 24)?).ok()?,
            usize::try_from(u64_at(cubin, h + 32)?).ok()?,
        ))
    };
    let (_, names_at, names_len) = section(shstrndx)?;
    let names = cubin.get(names_at..names_at.checked_add(names_len)?)?;
    let mut out = Vec::new();
    for i in 0..shnum {
        let (name_at, at, len) = section(i)?;
        let name = names.get(name_at..)?;
        let name = std::str::from_utf8(&name[..name.iter().position(|&c| c == 0)?]).ok()?;
        let Some(entry) = name.strip_prefix(".nv.info.") else {
            continue;
        };
        let b = cubin.get(at..at.checked_add(len)?)?;
        let mut params: Vec<(u16, usize)> = Vec::new();
        let mut k = 0;
        while k < b.len() {
            let (format, attribute) = (*b.get(k)?, *b.get(k + 1)?);
            if format != EIFMT_SVAL {
                k += 4; // EIFMT_NVAL / BVAL / HVAL: the value fits in the record's last 2 bytes
                continue;
            }
            let value_len = usize::from(u16_at(b, k + 2)?);
            if attribute == EIATTR_KPARAM_INFO {
                // index (u32), ordinal (u16), offset (u16), then the size in bits 18..32.
                let ordinal = u16_at(b, k + 8)?;
                let size = (u32_at(b, k + 12)? >> 18) as usize;
                params.push((ordinal, size));
            }
            k += 4 + value_len;
        }
        params.sort_unstable();
        out.push((entry.to_string(), params.into_iter().map(|(_, size)| size).collect()));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // ---- helpers --------------------------------------------------------

    /// A scratch folder removed on drop (std only; no tempfile dependency).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "attnforge-compile-test-{}-{tag}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        /// Creates an empty (fake) file and returns its path.
        fn touch(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
            p
        }
        fn mkdir(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(&p).unwrap();
            p
        }
        /// An executable shell script.
        fn script(&self, rel: &str, body: &str) -> PathBuf {
            use std::os::unix::fs::PermissionsExt;
            let p = self.0.join(rel);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A search rooted in `root`, with no linker probe and no python.
    fn env_in(root: &Path) -> SearchEnv {
        SearchEnv {
            root: root.to_path_buf(),
            linker_cache: false,
            python: None,
            python_timeout: Duration::from_secs(5),
            ..SearchEnv::default()
        }
    }

    fn found(d: &Discovery) -> Vec<PathBuf> {
        d.candidates
            .iter()
            .filter_map(|c| match &c.outcome {
                Outcome::Found(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    // ---- discovery (fake files, never loaded) ----------------------------

    #[test]
    fn wgmma_serialization_is_read_from_ptxas_warnings() {
        let warned = "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are \
                      serialized due to insufficient register resources for the wgmma pipeline in the function 'k'";
        assert!(wgmma_serialized(warned));
        assert!(!wgmma_serialized(
            "ptxas info    : Used 168 registers, used 16 barriers"
        ));
    }

    #[test]
    fn discovery_order_follows_the_documented_steps() {
        let t = TempDir::new("order");
        let r = &t.0;
        let expect = vec![
            t.touch("cudahome/lib64/libnvrtc.so.13"),
            t.touch("cudahome/lib/libnvrtc.so.13"),
            t.touch("cudapath/lib/libnvrtc.so"),
            t.touch("usr/local/cuda/lib64/libnvrtc.so.13"),
            t.touch("ld2/libnvrtc.so.13"),
            t.touch("venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("home/.local/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("home/.local/lib/python3.9/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so"),
            t.touch("usr/local/lib/python3.10/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("usr/local/lib/python3.10/dist-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("usr/lib/python3/dist-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("opt/a/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            t.touch("afhome/.nvrtc/nvidia/cu13/lib/libnvrtc.so.13"),
        ];
        // Noise that must not be picked up.
        t.touch("home/.local/lib/python3.9/site-packages/nvidia/cu13/lib/libnvrtc.so.12");
        t.touch("opt/novenv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13");
        t.mkdir("ld1");

        let mut env = env_in(r);
        env.cuda_home = Some(r.join("cudahome"));
        env.cuda_path = Some(r.join("cudapath"));
        env.ld_library_path = Some(std::env::join_paths([r.join("ld1"), PathBuf::new(), r.join("ld2")]).unwrap());
        env.virtual_env = Some(r.join("venv"));
        env.home = Some(r.join("home"));
        env.attnforge_home = Some(r.join("afhome"));

        let d = discover_in(&env);
        assert_eq!(found(&d), expect, "{:#?}", d.searched());
        assert_eq!(d.first_found(), Some(expect[0].as_path()));
        // Sources appear in step order.
        let sources: Vec<Source> = d.candidates.iter().map(|c| c.source).collect();
        let mut dedup = sources.clone();
        dedup.dedup();
        assert_eq!(
            dedup,
            vec![
                Source::Override,
                Source::CudaHome,
                Source::CudaPath,
                Source::UsrLocalCuda,
                Source::LdLibraryPath,
                Source::SitePackages,
                Source::ProjectLocal,
            ]
        );
        // The CUDA 12 folder is explained, not silently skipped.
        let lines = d.searched();
        assert!(
            lines.iter().any(
                |l| l.contains("python3.9/site-packages/nvidia/cu13/lib") && l.contains("only libnvrtc.so.12 here")
            ),
            "{lines:#?}"
        );
        assert!(lines
            .iter()
            .any(|l| l.contains("ld1") && l.contains("no libnvrtc.so.13 or libnvrtc.so here")));
        assert_eq!(lines[0], "ATTNFORGE_NVRTC: not set");
    }

    #[test]
    fn override_is_authoritative() {
        let t = TempDir::new("override");
        let lib = t.touch("custom/libnvrtc.so.13");
        t.touch("usr/local/cuda/lib64/libnvrtc.so.13");

        // A file.
        let mut env = env_in(&t.0);
        env.attnforge_nvrtc = Some(lib.clone());
        let d = discover_in(&env);
        assert_eq!(d.candidates.len(), 1);
        assert_eq!(d.candidates[0].source, Source::Override);
        assert_eq!(d.candidates[0].outcome, Outcome::Found(lib.clone()));

        // A folder.
        env.attnforge_nvrtc = Some(t.0.join("custom"));
        assert_eq!(found(&discover_in(&env)), vec![lib]);

        // A `pip install --target` folder.
        let wheel = t.touch("pipdir/nvidia/cu13/lib/libnvrtc.so.13");
        env.attnforge_nvrtc = Some(t.0.join("pipdir"));
        assert_eq!(found(&discover_in(&env)), vec![wheel]);

        // Missing: nothing else is searched, and get() says NotFound.
        env.attnforge_nvrtc = Some(t.0.join("nope/libnvrtc.so.13"));
        let d = discover_in(&env);
        assert_eq!(d.candidates.len(), 1);
        assert!(matches!(&d.candidates[0].outcome, Outcome::Missing(r) if r.contains("does not exist")));
        match init(&env) {
            Err(CompileError::NotFound { searched }) => {
                assert_eq!(searched.len(), 1);
                assert!(searched[0].contains("nope/libnvrtc.so.13"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn relative_override_is_made_absolute() {
        let mut env = env_in(Path::new("/nonexistent-root"));
        env.attnforge_nvrtc = Some(PathBuf::from("rel/libnvrtc.so.13"));
        let d = discover_in(&env);
        assert!(d.candidates[0].location.is_absolute());
    }

    #[test]
    fn soname_preferred_over_unversioned_name_in_a_folder() {
        let t = TempDir::new("pref");
        t.touch("d/libnvrtc.so");
        let want = t.touch("d/libnvrtc.so.13");
        assert_eq!(lib_in_dir(&t.0.join("d")), Outcome::Found(want));
        assert_eq!(
            lib_in_dir(&t.0.join("missing")),
            Outcome::Missing("no such directory".into())
        );
    }

    #[test]
    fn duplicate_folders_are_listed_once() {
        let t = TempDir::new("dedup");
        let lib = t.touch("usr/local/cuda/lib64/libnvrtc.so.13");
        let mut env = env_in(&t.0);
        env.cuda_home = Some(t.0.join("usr/local/cuda"));
        env.cuda_path = Some(t.0.join("usr/local/cuda"));
        env.ld_library_path = Some(t.0.join("usr/local/cuda/lib64").into_os_string());
        let d = discover_in(&env);
        assert_eq!(found(&d), vec![lib]);
        let hits: Vec<&Candidate> = d
            .candidates
            .iter()
            .filter(|c| c.location.ends_with("usr/local/cuda/lib64"))
            .collect();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].source, Source::CudaHome);
    }

    #[test]
    fn python_sys_path_is_searched_last() {
        let t = TempDir::new("py");
        let site = t.0.join("pysite");
        let lib = t.touch("pysite/nvidia/cu13/lib/libnvrtc.so.13");
        let local = t.touch("afhome/.nvrtc/nvidia/cu13/lib/libnvrtc.so.13");
        let py = t.script(
            "fakepy",
            &format!("echo ''\necho relative/dir\necho /no/such/dir\necho {}", site.display()),
        );
        let mut env = env_in(&t.0);
        env.python = Some(py.into_os_string());
        env.attnforge_home = Some(t.0.join("afhome"));
        let d = discover_in(&env);
        assert_eq!(found(&d), vec![local, lib]);
        assert_eq!(d.candidates.last().unwrap().source, Source::PythonSysPath);
    }

    #[test]
    fn python_probe_is_time_bounded() {
        let t = TempDir::new("pyslow");
        let py = t.script("slowpy", "exec sleep 10");
        let mut env = env_in(&t.0);
        env.python = Some(py.into_os_string());
        env.python_timeout = Duration::from_millis(200);
        let t0 = Instant::now();
        let d = discover_in(&env);
        assert!(t0.elapsed() < Duration::from_secs(5));
        let last = d.candidates.last().unwrap();
        assert_eq!(last.source, Source::PythonSysPath);
        assert!(
            matches!(&last.outcome, Outcome::Missing(r) if r.contains("timed out")),
            "{last}"
        );
    }

    #[test]
    fn search_stops_at_the_first_hit() {
        // The visitor in init() breaks on success; python must then never run.
        let t = TempDir::new("lazy");
        t.touch("usr/local/cuda/lib64/libnvrtc.so.13");
        let marker = t.0.join("python-ran");
        let py = t.script("py", &format!("touch {}", marker.display()));
        let mut env = env_in(&t.0);
        env.python = Some(py.into_os_string());
        let mut seen = Vec::new();
        search(&env, |c| {
            let hit = matches!(c.outcome, Outcome::Found(_));
            seen.push(c);
            if hit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(seen.last().unwrap().source, Source::UsrLocalCuda);
        assert!(!marker.exists());
    }

    #[test]
    fn not_found_error_names_the_fix_and_the_places() {
        let t = TempDir::new("none");
        let err = init(&env_in(&t.0)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CompileError::NotFound { .. }));
        assert!(msg.contains("pip install nvidia-cuda-nvrtc==13.0.*"), "{msg}");
        assert!(msg.contains("make nvrtc"), "{msg}");
        assert!(msg.contains("ATTNFORGE_NVRTC"), "{msg}");
        assert!(msg.contains("usr/local/cuda/lib64: no such directory"), "{msg}");
        assert!(
            msg.contains("/opt/*/.venv/lib/python3*/site-packages: no match"),
            "{msg}"
        );
    }

    // ---- options, arch, error text ---------------------------------------

    #[test]
    fn base_options_are_fixed_and_ordered() {
        assert_eq!(
            base_options("sm_90a"),
            [
                "--gpu-architecture=sm_90a",
                "-std=c++17",
                "-default-device",
                "--no-cache",
                "--ptxas-options=-v"
            ]
        );
        assert_eq!(
            base_options_for("sm_90a", Emit::Ptx),
            [
                "--gpu-architecture=compute_90a",
                "-std=c++17",
                "-default-device",
                "--no-cache"
            ]
        );
        assert_eq!(base_options_for("sm_86", Emit::Ptx)[0], "--gpu-architecture=compute_86");
        let extra = vec!["-DB=2".to_string(), "-DA=1".to_string()];
        let req = CompileRequest {
            options: &extra,
            ..CompileRequest::new("", "x.cu", "sm_80")
        };
        let eff = req.effective_options();
        assert_eq!(&eff[..5], base_options("sm_80").as_slice());
        assert_eq!(&eff[5..], ["-DB=2", "-DA=1"]);
    }

    #[test]
    fn arch_parsing() {
        assert_eq!(parse_arch("sm_80").unwrap(), (80, ""));
        assert_eq!(parse_arch("sm_90a").unwrap(), (90, "a"));
        assert_eq!(parse_arch("sm_100f").unwrap(), (100, "f"));
        for bad in ["", "80", "sm80", "sm_8", "sm_90b", "compute_90", "sm_90a "] {
            assert!(matches!(parse_arch(bad), Err(CompileError::InvalidArch(_))), "{bad}");
        }
    }

    #[test]
    fn compilation_error_message_format() {
        let e = CompileError::Compilation {
            program: "fwd_bf16_d128.cu".into(),
            log: "fwd_bf16_d128.cu(3): error: oops".into(),
            source_path: Some(PathBuf::from("/tmp/attnforge-failed/fwd_bf16_d128.cu")),
        };
        assert_eq!(
            e.to_string(),
            "NVRTC failed to compile fwd_bf16_d128.cu (source written to \
             /tmp/attnforge-failed/fwd_bf16_d128.cu):\nfwd_bf16_d128.cu(3): error: oops"
        );
        let e = CompileError::Compilation {
            program: "x.cu".into(),
            log: "L".into(),
            source_path: None,
        };
        assert_eq!(e.to_string(), "NVRTC failed to compile x.cu:\nL");
    }

    #[test]
    fn failed_source_names_are_sanitised() {
        let p = write_failed_source("../../etc/evil name.cu", "int x;").unwrap();
        assert_eq!(p.parent().unwrap(), std::env::temp_dir().join("attnforge-failed"));
        assert_eq!(p.file_name().unwrap(), "evil_name.cu");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "int x;");
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn result_names() {
        assert_eq!(result_name(6), "NVRTC_ERROR_COMPILATION");
        assert_eq!(result_name(18), "NVRTC_ERROR_BUSY");
        assert_eq!(result_name(99), "nvrtcResult 99");
        assert_eq!(result_name(-1), "nvrtcResult -1");
    }

    // ---- ptxas log parsing (real NVRTC 13.0.88 output) -------------------

    /// The tiny mma kernel below, sm_80.
    const LOG_MMA_SM80: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'mma_probe' for 'sm_80'
ptxas info    : Function properties for mma_probe
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 0 barriers, 512 bytes smem, 376 bytes cmem[0]
ptxas info    : Compile time = 6.336 ms
";

    /// Three entries (one templated), a `__noinline__` device function and
    /// `--maxrregcount=24` to force spills; sm_90a prints no cmem[0].
    const LOG_MULTI_SM90A: &str = "\
ptxas info    : Overriding maximum register limit 256 for '_Z5templILi3EEvPf' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'second' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'spiller' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5templILi3EEvPf' for 'sm_90a'
ptxas info    : Function properties for _Z5templILi3EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Compile time = 1.959 ms
ptxas info    : Compiling entry function 'second' for 'sm_90a'
ptxas info    : Function properties for second
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 512 bytes smem
ptxas info    : Compile time = 1.254 ms
ptxas info    : Compiling entry function 'spiller' for 'sm_90a'
ptxas info    : Function properties for spiller
ptxas         .     376 bytes stack frame, 408 bytes spill stores, 584 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 376 bytes cumulative stack size
ptxas info    : Compile time = 18.780 ms
ptxas info    : Function properties for _Z6helperfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    /// The same source for sm_80 (cmem[0] present).
    const LOG_SPILLER_SM80: &str = "\
ptxas info    : Compiling entry function 'spiller' for 'sm_80'
ptxas info    : Function properties for spiller
ptxas         .     376 bytes stack frame, 372 bytes spill stores, 556 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 376 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 15.591 ms
ptxas info    : Function properties for _Z6helperfi
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
";

    #[test]
    fn parses_single_kernel_log() {
        assert_eq!(
            parse_ptxas_log(LOG_MMA_SM80),
            vec![KernelResources {
                entry: "mma_probe".into(),
                registers: 18,
                stack_frame: 0,
                spill_stores: 0,
                spill_loads: 0,
                smem_static: 512,
                cmem0: 376,
            }]
        );
    }

    #[test]
    fn parses_multi_kernel_log_with_spills() {
        let r = parse_ptxas_log(LOG_MULTI_SM90A);
        let names: Vec<&str> = r.iter().map(|k| k.entry.as_str()).collect();
        assert_eq!(names, ["_Z5templILi3EEvPf", "second", "spiller"]);
        assert_eq!((r[0].registers, r[0].smem_static, r[0].cmem0), (10, 0, 0));
        assert_eq!((r[1].registers, r[1].smem_static), (14, 512));
        assert_eq!(
            r[2],
            KernelResources {
                entry: "spiller".into(),
                registers: 24,
                stack_frame: 376,
                spill_stores: 408,
                spill_loads: 584,
                smem_static: 0,
                cmem0: 0,
            }
        );
        // The device function's properties (non-zero here) must not leak into
        // the entry before it.
        let r = parse_ptxas_log(LOG_SPILLER_SM80);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].stack_frame, r[0].spill_stores, r[0].spill_loads, r[0].cmem0),
            (376, 372, 556, 372)
        );
    }

    #[test]
    fn parses_nothing_from_noise() {
        assert!(parse_ptxas_log("").is_empty());
        assert!(parse_ptxas_log("warning: something\nUsed 5 registers\n").is_empty());
    }

    // ---- real compiles (need NVRTC; skipped otherwise) -------------------

    /// Header-free kernel with one bf16 tensor-core MMA via inline PTX.
    const MMA_SRC: &str = r#"
extern "C" __global__ void mma_probe(const unsigned* __restrict__ a,
                                     const unsigned* __restrict__ b,
                                     float* __restrict__ c) {
    __shared__ float stage[128];
    unsigned lane = threadIdx.x & 31;
    unsigned a0 = a[lane * 4 + 0], a1 = a[lane * 4 + 1], a2 = a[lane * 4 + 2], a3 = a[lane * 4 + 3];
    unsigned b0 = b[lane * 2 + 0], b1 = b[lane * 2 + 1];
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    stage[lane * 4 + 0] = d0;
    stage[lane * 4 + 1] = d1;
    stage[lane * 4 + 2] = d2;
    stage[lane * 4 + 3] = d3;
    __syncwarp();
    for (int i = 0; i < 4; ++i) c[lane * 4 + i] = stage[(lane * 4 + i + 4) & 127];
}
"#;

    fn nvrtc() -> Option<&'static Nvrtc> {
        match Nvrtc::get() {
            Ok(n) => Some(n),
            Err(e @ CompileError::NotFound { .. }) => {
                if std::env::var_os("ATTNFORGE_REQUIRE_NVRTC").is_some_and(|v| v != "0") {
                    panic!("ATTNFORGE_REQUIRE_NVRTC is set but NVRTC is missing: {e}");
                }
                println!(
                    "skipped: NVRTC not found (set ATTNFORGE_NVRTC=/path/to/libnvrtc.so.13 \
                     or run `make nvrtc`)"
                );
                None
            }
            Err(e) => panic!("NVRTC found but unusable: {e}"),
        }
    }

    fn check_cubin(bin: &[u8]) {
        assert!(bin.len() > 64);
        assert_eq!(&bin[..4], b"\x7fELF", "not an ELF file");
        // e_machine == EM_CUDA (190).
        assert_eq!(u16::from_le_bytes([bin[18], bin[19]]), 190);
    }

    #[test]
    fn real_compile_mma_cubin() {
        let Some(nv) = nvrtc() else { return };
        for arch in ["sm_80", "sm_90a"] {
            let out = nv.compile(&CompileRequest::new(MMA_SRC, "mma_probe.cu", arch)).unwrap();
            check_cubin(&out.binary);
            assert!(out.log.contains(&format!("for '{arch}'")), "{}", out.log);
            assert_eq!(out.resources.len(), 1, "{}", out.log);
            let k = &out.resources[0];
            assert_eq!(k.entry, "mma_probe");
            assert!(k.registers > 0 && k.registers <= 255, "{k:?}");
            assert_eq!((k.spill_stores, k.spill_loads, k.stack_frame), (0, 0, 0));
            assert_eq!(k.smem_static, 512);
            println!(
                "compile mma_probe.cu {arch} cubin: {:?}, {} bytes, {k:?}",
                out.elapsed,
                out.binary.len()
            );
        }
    }

    #[test]
    fn cubin_params_reads_each_entrys_parameter_sizes() {
        assert_eq!(cubin_params(b"not an elf"), None);
        assert_eq!(cubin_params(&[0x7f, b'E', b'L', b'F', 2, 1, 0, 0]), None, "truncated");
        let Some(nv) = nvrtc() else { return };
        let src = r#"
struct Block { long long a[5]; int n; };
struct __align__(64) Map { unsigned long long w[16]; };
extern "C" __global__ void two(const Block b, const __grid_constant__ Map m, float* out) {
    if (threadIdx.x == 0) out[0] = b.a[0] + b.n + m.w[3];
}
extern "C" __global__ void one(int* out) { out[0] = 1; }
"#;
        for arch in ["sm_80", "sm_90a"] {
            let out = nv.compile(&CompileRequest::new(src, "params_probe.cu", arch)).unwrap();
            let mut got = cubin_params(&out.binary).expect("parses");
            got.sort();
            assert_eq!(
                got,
                vec![("one".to_string(), vec![8]), ("two".to_string(), vec![48, 128, 8])],
                "{arch}"
            );
        }
    }

    #[test]
    fn real_compile_mma_ptx() {
        let Some(nv) = nvrtc() else { return };
        for (arch, target) in [("sm_80", ".target sm_80"), ("sm_90a", ".target sm_90a")] {
            let req = CompileRequest {
                emit: Emit::Ptx,
                ..CompileRequest::new(MMA_SRC, "mma_probe.cu", arch)
            };
            let out = nv.compile(&req).unwrap();
            let ptx = std::str::from_utf8(&out.binary).unwrap();
            assert!(!ptx.ends_with('\0'));
            assert!(ptx.contains(target), "{ptx}");
            assert!(ptx.contains(".entry mma_probe"));
            assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
            assert!(out.resources.is_empty());
        }
    }

    #[test]
    fn real_compile_error_writes_the_source() {
        let Some(nv) = nvrtc() else { return };
        let src = "extern \"C\" __global__ void broken(float* o) { o[0] = undefined_name; }\n";
        let name = format!("broken_probe_{}.cu", std::process::id());
        let err = nv.compile(&CompileRequest::new(src, &name, "sm_80")).unwrap_err();
        let CompileError::Compilation {
            program,
            log,
            source_path,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(program, &name);
        assert!(log.contains("undefined_name"), "{log}");
        assert!(log.contains(&name), "{log}");
        let path = source_path.as_ref().expect("source written");
        assert_eq!(std::fs::read_to_string(path).unwrap(), src);
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "NVRTC failed to compile {name} (source written to {}):\n",
                path.display()
            )),
            "{msg}"
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn real_bad_option_and_bad_arch() {
        let Some(nv) = nvrtc() else { return };
        let opts = vec!["--no-such-option".to_string()];
        let req = CompileRequest {
            options: &opts,
            ..CompileRequest::new(MMA_SRC, "opt.cu", "sm_80")
        };
        match nv.compile(&req) {
            Err(CompileError::Nvrtc { call, code, .. }) => {
                assert_eq!(call, "nvrtcCompileProgram");
                assert!(code.contains("NVRTC_ERROR_INVALID_OPTION"), "{code}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            nv.compile(&CompileRequest::new(MMA_SRC, "a.cu", "sm90")),
            Err(CompileError::InvalidArch(_))
        ));
        assert!(matches!(
            nv.compile(&CompileRequest::new("int a;\0", "a.cu", "sm_80")),
            Err(CompileError::InvalidInput { what: "source" })
        ));
    }

    #[test]
    fn real_concurrent_compiles() {
        let Some(nv) = nvrtc() else { return };
        let handles: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    let src = MMA_SRC.replace("mma_probe", &format!("mma_probe_{i}"));
                    let arch = if i % 2 == 0 { "sm_80" } else { "sm_90a" };
                    let name = format!("conc_{i}.cu");
                    let out = nv.compile(&CompileRequest::new(&src, &name, arch)).unwrap();
                    check_cubin(&out.binary);
                    assert_eq!(out.resources[0].entry, format!("mma_probe_{i}"));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn real_soname_trick() {
        let Some(nv) = nvrtc() else { return };
        assert_eq!(nv.version().0, NVRTC_MAJOR);
        assert_eq!(nv.version_string(), format!("{}.{}", nv.version().0, nv.version().1));
        assert!(nv.library_path().is_absolute());
        assert!(nv
            .builtins_path()
            .to_string_lossy()
            .contains(&format!("libnvrtc-builtins.so.{}", nv.version_string())));
        // dlopen("libnvrtc.so.13") now returns our object.
        assert!(nv.soname_resolves_here());
        // So does cudarc's loader, unless some other libnvrtc.so is on the
        // linker path (cudarc tries that name first).
        let other = probe_soname("libnvrtc.so").ok();
        if other.is_none() || other.as_deref() == Some(nv.library_path()) {
            assert!(nv.cudarc_agrees());
            // And cudarc's own API works on top of our load.
            let ptx = cudarc::nvrtc::compile_ptx("extern \"C\" __global__ void k(float* o) { o[0] = 1.0f; }").unwrap();
            assert!(ptx.to_src().contains(".entry k"));
        } else {
            println!("note: another libnvrtc.so at {other:?}; cudarc would load that one");
        }
    }

    #[test]
    fn real_timings() {
        let Some(nv) = nvrtc() else { return };
        let t = nv.timings();
        println!(
            "NVRTC {} from {}: get() {:?} (search {:?}, dlopen libnvrtc {:?}, builtins {:?})",
            nv.version_string(),
            nv.library_path().display(),
            t.total,
            t.search,
            t.dlopen_nvrtc,
            t.dlopen_builtins
        );
        let src = MMA_SRC.replace("mma_probe", "mma_timing");
        let mut times = Vec::new();
        for _ in 0..3 {
            let out = nv
                .compile(&CompileRequest::new(&src, "mma_timing.cu", "sm_90a"))
                .unwrap();
            // Every compile of the same source still reports resources
            // (NVRTC's own cache is off; a hit there would skip ptxas).
            assert_eq!(out.resources.len(), 1, "log: {:?}", out.log);
            times.push(out.elapsed);
        }
        println!("compile mma_timing.cu sm_90a cubin, 3 runs: {times:?}");
    }
}
