//! `attnforge`: pre-build kernel caches, compile and plan single specs, inspect
//! the cache, and check the machine. See `docs/cli.md`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use attnforge::compile::{CompileRequest, Emit, Nvrtc};
use attnforge::jit::{Jit, Origin};
use attnforge::plan::{variants, Variant};
use attnforge::{launch, matrix, plan, render, Arch, AttnSpec};
use attnforge_cache::{format_size, parse_size, Cache, CacheConfig};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

mod explain;

#[derive(Parser)]
#[command(
    name = "attnforge",
    version,
    about = "Compiler of specialized attention kernels: spec -> plan -> CUDA -> NVRTC CUBIN -> cache",
    long_about = "Compiler of specialized attention kernels.\n\n\
        A spec names one kernel in canonical form:\n  \
        {dir}.{dtype}.d{qk}[v{v}].{mask}.{layout}[.softcap][.det].{arch}\n  \
        e.g. fwd.bf16.d128.causal-br.thd.sm90a\n\n\
        dir: fwd|bwd   dtype: f16|bf16   d: multiple of 8 up to 256\n\
        mask: none|causal-tl|causal-br|window   layout: dense|thd\n\
        arch: sm80|sm86|sm89|sm90a\n\n\
        Environment: ATTNFORGE_CACHE_DIR (writable cache), ATTNFORGE_CACHE_PATH\n\
        (read-only prebuilt roots, colon-separated), ATTNFORGE_NVRTC (libnvrtc path)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile every spec of a coverage matrix into the user cache.
    Prebuild {
        /// Architectures, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "sm80,sm90a")]
        arch: Vec<String>,
        /// `default` (the embedded matrix) or a TOML matrix file.
        #[arg(long, default_value = "default")]
        matrix: String,
        /// Parallel compile jobs (default: number of CPUs).
        #[arg(long)]
        jobs: Option<usize>,
        /// No progress bar (also off when stderr is not a terminal).
        #[arg(long)]
        quiet: bool,
        /// The kernels a process on this instruction path takes: `planner`
        /// (each spec's plan and its short- and mid-keys variants) or `sm80` (the sm80
        /// path's kernels, as `ATTNFORGE_GENERATED_PATH=sm80` runs them).
        /// Default: `ATTNFORGE_GENERATED_PATH`, else `planner`.
        #[arg(long, value_enum)]
        generated_path: Option<GenPathArg>,
    },
    /// Compile one spec and write the CUDA source, PTX or CUBIN.
    Compile {
        /// Canonical spec, e.g. fwd.bf16.d128.causal-br.dense.sm80
        spec: String,
        #[arg(long, value_enum, default_value_t = EmitArg::Cubin)]
        emit: EmitArg,
        /// Output file (required for cubin; `-` or absent = stdout for cu/ptx).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Instruction path: the planner's choice, or the sm80 path (mma.sync
        /// templates) on any arch, e.g. to compare it with wgmma on sm90a. An
        /// sm80-path cubin is compiled fresh (not cached).
        #[arg(long, value_enum, default_value_t = PathArg::Planner)]
        path: PathArg,
    },
    /// Print the kernel plan for a spec and why each choice was made.
    Plan {
        /// Canonical spec, e.g. fwd.bf16.d128.causal-br.thd.sm90a
        spec: String,
        /// The plan as JSON (the form the cache's metadata keeps), for scripts.
        #[arg(long)]
        json: bool,
        /// Instruction path, as for `compile`.
        #[arg(long, value_enum, default_value_t = PathArg::Planner)]
        path: PathArg,
    },
    /// Inspect and maintain the kernel cache.
    Cache {
        #[command(subcommand)]
        cmd: CacheCmd,
    },
    /// Check NVRTC, the CUDA driver and GPU, cuDNN, and the cache roots.
    Doctor,
    /// Which backend runs a problem's forward and backward, and why each other
    /// candidate was rejected (no GPU needed).
    Explain(explain::ExplainArgs),
}

#[derive(Subcommand)]
enum CacheCmd {
    /// List cached kernels.
    Ls {
        /// Only specs containing this text.
        filter: Option<String>,
    },
    /// Entries and bytes per root.
    Stats,
    /// Re-hash every blob; exit non-zero if any entry is bad.
    Verify,
    /// Evict least-recently-used entries of the user root down to a size.
    Gc {
        /// e.g. 500M, 2G
        #[arg(long)]
        max_size: String,
    },
    /// Print the writable cache root.
    Path,
}

/// `prebuild --generated-path` (the policy's `GeneratedPath`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GenPathArg {
    Planner,
    Sm80,
}

impl GenPathArg {
    /// The flag, else `ATTNFORGE_GENERATED_PATH` (an invalid value is an error), else `planner`.
    fn resolve(flag: Option<GenPathArg>) -> Result<GenPathArg, String> {
        use attnforge::dispatch::GeneratedPath;
        if let Some(p) = flag {
            return Ok(p);
        }
        let var = attnforge::dispatch::policy::ENV_GENERATED_PATH;
        match std::env::var(var).map(|v| GeneratedPath::parse(&v)) {
            Err(_) | Ok(GeneratedPath::Planner) => Ok(GenPathArg::Planner),
            Ok(GeneratedPath::Sm80) => Ok(GenPathArg::Sm80),
            Ok(GeneratedPath::Invalid(v)) => Err(format!("{var}=`{v}` is not `planner` or `sm80`")),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PathArg {
    /// The planner's template for the spec's arch.
    Planner,
    /// The sm80 instruction path (`fwd_sm80.cu` / `bwd_sm80.cu`).
    Sm80,
    /// The planner's variant for short keys (at most 1024; 768 at d <= 64
    /// causal, 2048 at dense d > 192 causal), which a call takes by its keys'
    /// length where the spec has one (sm90a forwards whose tiles measured
    /// faster at short keys differ from the main plan's).
    ShortKeys,
    /// The planner's variant for keys of 769 to 1024 at d <= 64 causal
    /// (sm90a forwards: two consumer warpgroups, between the short-keys
    /// variant's one consumer and the main plan's three), which a call takes
    /// by its keys' length.
    MidKeys,
}

impl PathArg {
    /// The per-call variant that `--path short-keys|mid-keys` names: the
    /// variant and the specs that have one (the keys that take it:
    /// `Variant::keys`, per spec).
    fn keyed(self) -> Option<(Variant, &'static str)> {
        match self {
            PathArg::ShortKeys => Some((
                Variant::ShortKeys,
                "sm90a forwards whose tiles measured faster at short keys differ from the main plan's",
            )),
            PathArg::MidKeys => Some((Variant::MidKeys, "sm90a forwards at d <= 64 under a causal mask")),
            PathArg::Planner | PathArg::Sm80 => None,
        }
    }

    /// The name `--path` takes for it.
    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// The plan of `spec` on the requested instruction path.
fn plan_on(spec: &AttnSpec, path: PathArg) -> Result<attnforge::plan::KernelPlan, String> {
    if let Some((variant, which)) = path.keyed() {
        let name = path.name();
        return attnforge::plan::plan_variant(spec, variant)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!("{spec} has no {name} variant (only {which} have one): its other plans serve every length")
            });
    }
    match path {
        PathArg::Sm80 => attnforge::plan::plan_sm80_path(spec),
        _ => plan(spec),
    }
    .map_err(|e| e.to_string())
}

#[derive(Clone, Copy, ValueEnum)]
enum EmitArg {
    Cu,
    Ptx,
    Cubin,
}

type CliResult = Result<(), String>;

fn parse_spec(s: &str) -> Result<AttnSpec, String> {
    s.parse::<AttnSpec>().map_err(|e| e.to_string())
}

fn parse_archs(list: &[String]) -> Result<Vec<Arch>, String> {
    let mut out = Vec::new();
    for a in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let arch: Arch = a.parse().map_err(|e: attnforge::SpecError| e.to_string())?;
        if !out.contains(&arch) {
            out.push(arch);
        }
    }
    if out.is_empty() {
        return Err("--arch needs at least one of sm80, sm86, sm89, sm90a".into());
    }
    Ok(out)
}

fn median_ms(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn prebuild(
    arch: &[String],
    matrix_arg: &str,
    jobs: Option<usize>,
    quiet: bool,
    generated_path: Option<GenPathArg>,
) -> CliResult {
    let archs = parse_archs(arch)?;
    let path = GenPathArg::resolve(generated_path)?;
    let text = if matrix_arg == "default" {
        matrix::DEFAULT_MATRIX.to_string()
    } else {
        std::fs::read_to_string(matrix_arg).map_err(|e| format!("cannot read matrix file {matrix_arg}: {e}"))?
    };
    let specs = matrix::expand(&text, &archs).map_err(|e| format!("{matrix_arg}: {e}"))?;
    // Every kernel a call may take: the planner's, and the short-keys variant
    // where the spec has one (chosen per call by the keys' length); on the
    // sm80 path each spec's sm80-path kernel (its main one where the planner
    // takes that path already, which the jit builds under Variant::Main).
    let kernels: Vec<(AttnSpec, Variant)> = match path {
        GenPathArg::Planner => specs.iter().flat_map(|s| variants(s).map(move |v| (*s, v))).collect(),
        GenPathArg::Sm80 => specs.iter().map(|s| (*s, Variant::Sm80Path)).collect(),
    };
    // Fail early, with the real reason, when NVRTC is missing.
    Nvrtc::get().map_err(|e| e.to_string())?;
    let jit = Jit::new(Cache::open(CacheConfig::from_env()));
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .clamp(1, 64);
    let started = Instant::now();
    let bar = if quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(kernels.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let next = AtomicUsize::new(0);
    let compiled = AtomicUsize::new(0);
    let cached = AtomicUsize::new(0);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let compile_ms: Mutex<Vec<f64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(kernels.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(spec, variant)) = kernels.get(i) else { break };
                let name = format!("{spec}{}", variant.suffix());
                bar.set_message(name.clone());
                match jit.build_variant(&spec, variant) {
                    Ok(r) => {
                        if r.origin == Origin::Compiled {
                            compiled.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut v) = compile_ms.lock() {
                                v.push(r.kernel.meta.compile_ms);
                            }
                        } else {
                            cached.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(note) = r.repaired {
                            bar.println(format!("repaired: {note}"));
                        }
                    }
                    Err(e) => {
                        let line = format!("{name}: {e}");
                        bar.println(format!("FAILED {line}"));
                        if let Ok(mut f) = failures.lock() {
                            f.push(line);
                        }
                    }
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let failures = failures.into_inner().unwrap_or_default();
    let med = median_ms(compile_ms.into_inner().unwrap_or_default());
    let root = jit
        .cache()
        .user_root()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<memory>".into());
    println!(
        "prebuild: {} specs ({} kernels{}) for {} into {root}: {} compiled, {} cached, {} failed in {:.1}s ({} jobs); median compile {}",
        specs.len(),
        kernels.len(),
        match path {
            GenPathArg::Planner => " with the short- and mid-keys variants",
            GenPathArg::Sm80 => " on the sm80 instruction path",
        },
        archs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","),
        compiled.load(Ordering::Relaxed),
        cached.load(Ordering::Relaxed),
        failures.len(),
        started.elapsed().as_secs_f64(),
        jobs,
        med.map(|m| format!("{m:.0} ms/kernel")).unwrap_or_else(|| "n/a (nothing compiled)".into()),
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} kernels failed to build (first: {})",
            failures.len(),
            kernels.len(),
            failures[0]
        ))
    }
}

fn write_out(output: Option<&PathBuf>, bytes: &[u8]) -> CliResult {
    match output {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::write(p, bytes).map_err(|e| format!("cannot write {}: {e}", p.display()))
        }
        _ => std::io::stdout()
            .write_all(bytes)
            .map_err(|e| format!("cannot write to stdout: {e}")),
    }
}

fn compile(spec: &str, emit: EmitArg, output: Option<PathBuf>, path_arg: PathArg) -> CliResult {
    let spec = parse_spec(spec)?;
    let plan = plan_on(&spec, path_arg)?;
    let rendered = render::render(&plan).map_err(|e| e.to_string())?;
    match emit {
        EmitArg::Cu => write_out(output.as_ref(), rendered.source.as_bytes()),
        EmitArg::Ptx => {
            let nvrtc = Nvrtc::get().map_err(|e| e.to_string())?;
            let out = nvrtc
                .compile(&CompileRequest {
                    source: &rendered.source,
                    program_name: &rendered.program_name,
                    arch: spec.arch.nvrtc_arch(),
                    options: &plan.compile_options,
                    emit: Emit::Ptx,
                })
                .map_err(|e| e.to_string())?;
            write_out(output.as_ref(), &out.binary)
        }
        EmitArg::Cubin => {
            let Some(path) = output.filter(|p| p.as_os_str() != "-") else {
                return Err("--emit cubin writes binary data: give an output file with -o FILE".into());
            };
            // The planner's kernel through the cache; another path's compiled here.
            let (k, origin) = match path_arg {
                PathArg::Planner => {
                    let r = Jit::global().build(&spec).map_err(|e| e.to_string())?;
                    (r.kernel, r.origin)
                }
                PathArg::ShortKeys | PathArg::MidKeys => {
                    let (variant, ..) = path_arg.keyed().expect("short-keys and mid-keys name a variant");
                    let r = Jit::global().build_variant(&spec, variant).map_err(|e| e.to_string())?;
                    (r.kernel, r.origin)
                }
                PathArg::Sm80 => (
                    std::sync::Arc::new(attnforge::jit::build_plan(plan).map_err(|e| e.to_string())?),
                    Origin::Compiled,
                ),
            };
            write_out(Some(&path), &k.cubin)?;
            eprintln!(
                "{}: {} bytes, {} registers, {} B stack, {}/{} B spill st/ld, {} B smem ({:?}, key {})",
                spec,
                k.cubin.len(),
                k.meta.registers,
                k.meta.stack_frame,
                k.meta.spill_stores,
                k.meta.spill_loads,
                k.meta.smem_dynamic + k.meta.smem_static,
                origin,
                k.key
            );
            Ok(())
        }
    }
}

fn cache_cmd(cmd: CacheCmd) -> CliResult {
    let cache = Cache::open(CacheConfig::from_env());
    match cmd {
        CacheCmd::Path => {
            match cache.user_root() {
                Some(p) => println!("{}", p.display()),
                None => return Err("no writable cache root (using an in-memory cache)".into()),
            }
            Ok(())
        }
        CacheCmd::Ls { filter } => {
            let mut rows = cache.list();
            rows.sort_by(|a, b| a.meta.spec.cmp(&b.meta.spec));
            println!(
                "{:<48} {:>5} {:>6} {:>6} {:>9} {:>9}  key",
                "spec", "regs", "spill", "smem", "size", "compile"
            );
            let mut n = 0;
            for r in rows {
                if let Some(f) = &filter {
                    if !r.meta.spec.contains(f.as_str()) {
                        continue;
                    }
                }
                n += 1;
                println!(
                    "{:<48} {:>5} {:>6} {:>6} {:>9} {:>7.0}ms  {}",
                    r.meta.spec,
                    r.meta.registers,
                    r.meta.spill_stores + r.meta.spill_loads,
                    r.meta.smem_dynamic + r.meta.smem_static,
                    format_size(r.size),
                    r.meta.compile_ms,
                    &r.key.to_string()[..16]
                );
            }
            println!("{n} entries");
            Ok(())
        }
        CacheCmd::Stats => {
            let st = cache.stats();
            for r in &st.roots {
                println!(
                    "{:<10} {}: {} entries, {} ({} temp files)",
                    format!("{:?}", r.kind),
                    r.path.display(),
                    r.entries,
                    format_size(r.bytes),
                    r.temp_files
                );
            }
            println!("total: {} entries, {}", st.total_entries, format_size(st.total_bytes));
            Ok(())
        }
        CacheCmd::Verify => {
            let rep = cache.verify();
            for i in &rep.issues {
                println!("BAD {i}");
            }
            println!(
                "verify: {} entries ok, {} issues in {} root(s) (index: {:?})",
                rep.entries_ok,
                rep.issues.len(),
                rep.roots.len(),
                rep.index
            );
            if rep.is_clean() {
                Ok(())
            } else {
                Err(format!(
                    "{} bad cache entries (run `attnforge cache gc` to remove them)",
                    rep.issues.len()
                ))
            }
        }
        CacheCmd::Gc { max_size } => {
            let max = parse_size(&max_size).map_err(|e| e.to_string())?;
            let rep = cache.gc(max).map_err(|e| e.to_string())?;
            println!(
                "gc {}: {} -> {} ({} entries left); evicted {} entries ({}); removed {} bad and {} temp files",
                rep.root.display(),
                format_size(rep.bytes_before),
                format_size(rep.bytes_after),
                rep.entries_after,
                rep.evicted.len(),
                format_size(rep.evicted_bytes),
                rep.removed_bad.len(),
                rep.removed_temp.len()
            );
            for f in &rep.failures {
                println!("could not remove: {f}");
            }
            Ok(())
        }
    }
}

fn doctor() -> CliResult {
    let mut problems = 0;
    println!("attnforge {}", env!("CARGO_PKG_VERSION"));
    match Nvrtc::get() {
        Ok(n) => println!("nvrtc      ok: {} ({})", n.version_string(), n.library_path().display()),
        Err(e) => {
            problems += 1;
            println!("nvrtc      MISSING: {e}");
        }
    }
    let disc = Nvrtc::discover();
    for line in disc.searched() {
        println!("             searched {line}");
    }
    if launch::driver_available() {
        match launch::ensure_context(0).and_then(|_| launch::current_compute_capability()) {
            Ok((ma, mi)) => {
                let arch = Arch::from_compute_capability(ma, mi)
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "no attnforge arch".into());
                println!("cuda       driver ok; GPU 0 compute capability {ma}.{mi} ({arch})");
            }
            Err(e) => println!("cuda       driver found, but no usable GPU: {e}"),
        }
    } else {
        println!("cuda       no driver (libcuda.so): kernels can be compiled and cached, not run");
    }
    let cudnn = ["libcudnn.so.9", "libcudnn.so"].iter().find_map(|name| {
        // SAFETY: probing a library by name; it is unloaded at once.
        unsafe { libloading::Library::new(name) }.ok().map(|_| *name)
    });
    match cudnn {
        Some(n) => println!("cudnn      found ({n})"),
        None => println!("cudnn      not found (only needed for the cuDNN backend)"),
    }
    let cache = Cache::open(CacheConfig::from_env());
    for r in cache.roots() {
        println!("cache      {:?} {} (exists: {})", r.kind, r.path.display(), r.exists);
    }
    for w in cache.warnings() {
        println!("cache      warning: {w}");
    }
    // The dispatch policy a process started here would take from the environment.
    let policy = attnforge::dispatch::Policy::from_env();
    println!("policy     {policy}");
    if let attnforge::dispatch::GeneratedPath::Invalid(v) = &policy.generated_path {
        println!("policy     warning: ATTNFORGE_GENERATED_PATH=`{v}` is not `planner` or `sm80`: the generated backend declines every problem");
    }
    if problems > 0 {
        Err("NVRTC is required to compile kernels".into())
    } else {
        Ok(())
    }
}

fn run(cli: Cli) -> CliResult {
    match cli.cmd {
        Cmd::Prebuild {
            arch,
            matrix,
            jobs,
            quiet,
            generated_path,
        } => prebuild(&arch, &matrix, jobs, quiet, generated_path),
        Cmd::Compile {
            spec,
            emit,
            output,
            path,
        } => compile(&spec, emit, output, path),
        Cmd::Plan { spec, json, path } => {
            let spec = parse_spec(&spec)?;
            let p = plan_on(&spec, path)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&p).map_err(|e| e.to_string())?);
            } else {
                print!("{p}");
                if matches!(path, PathArg::Planner) {
                    for keyed in [PathArg::ShortKeys, PathArg::MidKeys] {
                        let Some((variant, _)) = keyed.keyed() else {
                            continue;
                        };
                        if let Some(keys) = variant.keys(&spec) {
                            let name = keyed.name();
                            let keys = if *keys.start() <= 1 {
                                format!("keys up to {}", keys.end())
                            } else {
                                format!("keys of {}..={}", keys.start(), keys.end())
                            };
                            println!("variant: calls with {keys} take the {name} plan (`attnforge plan {spec} --path {name}`)");
                        }
                    }
                }
            }
            Ok(())
        }
        Cmd::Cache { cmd } => cache_cmd(cmd),
        Cmd::Doctor => doctor(),
        Cmd::Explain(args) => explain::run(args),
    }
}

fn main() -> ExitCode {
    // A reader that stops early (`attnforge cache ls | head`) ends the
    // process quietly, as it does other Unix tools, instead of a panic in
    // `println!` (Rust ignores SIGPIPE by default).
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal, before any
    // other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            let one_line = msg.lines().next().unwrap_or("failed").to_string();
            let more = msg.lines().count() > 1;
            let verbose = std::env::var_os("ATTNFORGE_VERBOSE").is_some();
            if more && !verbose {
                // The first line of a multi-line error (e.g. an NVRTC log) ends
                // where the details start: say how to see them.
                let head = one_line.trim_end_matches(':');
                eprintln!("attnforge: error: {head} (details: set ATTNFORGE_VERBOSE=1)");
            } else {
                eprintln!("attnforge: error: {one_line}");
            }
            if more && verbose {
                eprintln!("{msg}");
            }
            ExitCode::FAILURE
        }
    }
}
