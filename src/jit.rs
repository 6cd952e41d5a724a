//! The library entry point: `get_or_build(&spec)`, which runs the pipeline
//! spec → plan → render → compile → cache and returns a [`CompiledKernel`].
//!
//! Lookups go memo (in-process) → disk cache (read-only prebuilt roots, then
//! the user root) → NVRTC. Concurrent requests for one spec compile it once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use attnforge_cache::{Cache, CacheConfig, CacheKey, KernelMeta, KeyBuilder, Lookup};

use crate::compile::{CompileRequest, Emit, Nvrtc};
use crate::error::Error;
use crate::plan::{plan_variant, KernelPlan, Variant};
use crate::render::{render, templates_fingerprint, Rendered};
use crate::spec::AttnSpec;

/// Where a kernel came from on this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled by NVRTC just now (and stored).
    Compiled,
    /// Read from a disk cache root.
    Disk,
    /// Served from this process's memo.
    Memo,
}

/// A CUBIN ready to load, with what the launcher needs to launch it.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    pub spec: AttnSpec,
    /// Which of the spec's plans this is ([`Variant::Main`] for the planner's).
    pub variant: Variant,
    pub plan: KernelPlan,
    pub key: CacheKey,
    pub cubin: Vec<u8>,
    pub meta: KernelMeta,
    /// How the first request of this process obtained it.
    pub origin: Origin,
}

/// Everything that changes the bytes of a CUBIN, in a fixed order.
pub fn cache_key(plan: &KernelPlan, rendered: &Rendered, nvrtc_version: &str, options: &[String]) -> CacheKey {
    let plan_json = serde_json::to_string(plan).unwrap_or_default();
    let mut kb = KeyBuilder::new()
        .field("spec", plan.spec.to_string())
        .field("plan", plan_json)
        .field("templates", templates_fingerprint())
        .field("source", &rendered.source)
        .field("nvrtc", nvrtc_version)
        .field("arch", plan.spec.arch.nvrtc_arch())
        .field("options.len", options.len().to_string());
    for o in options {
        kb = kb.field("option", o);
    }
    kb.finish()
}

/// The NVRTC "version" of the alias that any version's CUBIN answers: looked
/// up only on a machine without NVRTC, where nothing can be compiled and a
/// CUBIN for the plan's arch loads whichever NVRTC built it.
const ANY_NVRTC: &str = "*";

/// The alias of a cache key: the same inputs minus the rendered source, which
/// is a pure function of the plan and the templates (both covered here). It
/// lets a new process find its CUBIN without rendering; the content key
/// itself still covers the source.
pub fn alias_key(plan: &KernelPlan, nvrtc_version: &str, options: &[String]) -> CacheKey {
    let mut kb = KeyBuilder::new()
        .field("alias", "1")
        .field("spec", plan.spec.to_string())
        .field("plan", serde_json::to_string(plan).unwrap_or_default())
        .field("templates", templates_fingerprint())
        .field("nvrtc", nvrtc_version)
        .field("arch", plan.spec.arch.nvrtc_arch())
        .field("options.len", options.len().to_string());
    for o in options {
        kb = kb.field("option", o);
    }
    kb.finish()
}

/// The exact NVRTC option list for a plan (the compile stage's base options,
/// then the plan's), as the cache key covers it.
pub fn compile_options(plan: &KernelPlan) -> Vec<String> {
    let mut req = CompileRequest::new("", "", plan.spec.arch.nvrtc_arch());
    req.options = &plan.compile_options;
    req.effective_options()
}

/// What the memo and the build locks key kernels by.
type KernelId = (AttnSpec, Variant);

/// A cache plus an in-process memo and per-kernel build locks, keyed by
/// (spec, variant).
pub struct Jit {
    cache: Cache,
    memo: RwLock<HashMap<KernelId, Arc<CompiledKernel>>>,
    building: Mutex<HashMap<KernelId, Arc<Mutex<()>>>>,
    nvrtc_version: OnceLock<String>,
}

/// What a build reports besides the kernel (for the CLI summary).
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub kernel: Arc<CompiledKernel>,
    pub origin: Origin,
    /// A corrupt entry found and replaced on the way, if any.
    pub repaired: Option<String>,
}

impl BuildReport {
    #[allow(clippy::too_many_arguments)]
    fn new(
        spec: &AttnSpec,
        variant: Variant,
        plan: KernelPlan,
        key: CacheKey,
        cubin: Vec<u8>,
        meta: KernelMeta,
        origin: Origin,
        repaired: Option<String>,
    ) -> Self {
        let kernel = Arc::new(CompiledKernel {
            spec: *spec,
            variant,
            plan,
            key,
            cubin,
            meta,
            origin,
        });
        BuildReport {
            kernel,
            origin,
            repaired,
        }
    }
}

impl Jit {
    pub fn new(cache: Cache) -> Self {
        Jit {
            cache,
            memo: RwLock::new(HashMap::new()),
            building: Mutex::new(HashMap::new()),
            nvrtc_version: OnceLock::new(),
        }
    }

    /// The process-wide instance, configured from the environment
    /// (`ATTNFORGE_CACHE_DIR`, `ATTNFORGE_CACHE_PATH`).
    pub fn global() -> &'static Jit {
        static G: OnceLock<Jit> = OnceLock::new();
        G.get_or_init(|| Jit::new(Cache::open(CacheConfig::from_env())))
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Alias files live beside the blob store in every root: `<root>/alias-v1/<alias>`
    /// holds the hex content key. Read-only roots first, like the cache.
    fn alias_dirs(&self) -> Vec<std::path::PathBuf> {
        self.cache
            .roots()
            .into_iter()
            .filter(|r| r.path.as_os_str() != attnforge_cache::MEMORY_ROOT)
            .map(|r| r.path.join("alias-v1"))
            .collect()
    }

    fn read_alias(&self, alias: &CacheKey) -> Option<CacheKey> {
        let name = alias.to_string();
        self.alias_dirs()
            .into_iter()
            .find_map(|d| std::fs::read_to_string(d.join(&name)).ok()?.trim().parse().ok())
    }

    /// The exact alias and the any-NVRTC one (used only where NVRTC is absent).
    fn write_aliases(&self, plan: &KernelPlan, alias: &CacheKey, options: &[String], key: &CacheKey) {
        self.write_alias(alias, key);
        self.write_alias(&alias_key(plan, ANY_NVRTC, options), key);
    }

    /// Best effort: a missing alias only costs a render on the next new process.
    fn write_alias(&self, alias: &CacheKey, key: &CacheKey) {
        let Some(root) = self.cache.user_root() else { return };
        let dir = root.join("alias-v1");
        let name = alias.to_string();
        if std::fs::read_to_string(dir.join(&name)).is_ok_and(|k| k.trim() == key.to_string()) {
            return;
        }
        let tmp = dir.join(format!(".tmp-{}-{name}", std::process::id()));
        let ok = std::fs::create_dir_all(&dir).is_ok()
            && std::fs::write(&tmp, key.to_string()).is_ok()
            && std::fs::rename(&tmp, dir.join(&name)).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// NVRTC's version for cache keys. Loading libnvrtc (110 MB) costs 6-10 ms,
    /// more than a whole disk hit may take, so the version is remembered per
    /// library file (path, size, mtime) in `<user root>/nvrtc-versions.json`
    /// and NVRTC is loaded only on a miss of that memo or of the kernel cache.
    fn nvrtc_version(&self) -> Result<String, Error> {
        if let Some(v) = self.nvrtc_version.get() {
            return Ok(v.clone());
        }
        let identity = crate::compile::locate_first().and_then(|p| {
            let m = std::fs::metadata(&p).ok()?;
            let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
            Some(format!("{}:{}:{mtime}", p.display(), m.len()))
        });
        let memo_file = self.cache.user_root().map(|r| r.join("nvrtc-versions.json"));
        let mut known: HashMap<String, String> = memo_file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let version = match identity.as_ref().and_then(|id| known.get(id)) {
            Some(v) => v.clone(),
            None => {
                let v = Nvrtc::get()?.version_string();
                if let (Some(id), Some(file)) = (identity, memo_file) {
                    known.insert(id, v.clone());
                    // Best effort, published by rename: a lost update only costs a load.
                    let tmp = file.with_extension(format!("tmp-{}", std::process::id()));
                    if let Ok(bytes) = serde_json::to_vec(&known) {
                        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &file).is_err() {
                            let _ = std::fs::remove_file(&tmp);
                        }
                    }
                }
                v
            }
        };
        let _ = self.nvrtc_version.set(version.clone());
        Ok(version)
    }

    /// Memo lookup only (the hot path), of the planner's kernel.
    #[inline]
    pub fn memo_get(&self, spec: &AttnSpec) -> Option<Arc<CompiledKernel>> {
        self.memo_get_variant(spec, Variant::Main)
    }

    /// Memo lookup only, of one variant of the spec.
    #[inline]
    pub fn memo_get_variant(&self, spec: &AttnSpec, variant: Variant) -> Option<Arc<CompiledKernel>> {
        self.memo.read().ok()?.get(&(*spec, variant)).cloned()
    }

    pub fn get_or_build(&self, spec: &AttnSpec) -> Result<Arc<CompiledKernel>, Error> {
        Ok(self.build(spec)?.kernel)
    }

    /// One variant of the spec's kernel; a spec without that variant gets
    /// its main kernel (so a caller may ask [`Variant::for_keys`] blindly).
    pub fn get_or_build_variant(&self, spec: &AttnSpec, variant: Variant) -> Result<Arc<CompiledKernel>, Error> {
        Ok(self.build_variant(spec, variant)?.kernel)
    }

    /// Like [`Jit::get_or_build`], reporting where the kernel came from.
    pub fn build(&self, spec: &AttnSpec) -> Result<BuildReport, Error> {
        self.build_variant(spec, Variant::Main)
    }

    /// Like [`Jit::get_or_build_variant`], reporting where the kernel came from.
    pub fn build_variant(&self, spec: &AttnSpec, variant: Variant) -> Result<BuildReport, Error> {
        if let Some(k) = self.memo_get_variant(spec, variant) {
            return Ok(BuildReport {
                kernel: k,
                origin: Origin::Memo,
                repaired: None,
            });
        }
        let lock = {
            let mut b = self
                .building
                .lock()
                .map_err(|_| Error::Other("build lock poisoned".into()))?;
            b.entry((*spec, variant)).or_default().clone()
        };
        let _guard = lock.lock().map_err(|_| Error::Other("build lock poisoned".into()))?;
        if let Some(k) = self.memo_get_variant(spec, variant) {
            return Ok(BuildReport {
                kernel: k,
                origin: Origin::Memo,
                repaired: None,
            });
        }
        let report = self.build_uncached(spec, variant)?;
        if let Ok(mut m) = self.memo.write() {
            m.insert((*spec, variant), report.kernel.clone());
        }
        Ok(report)
    }

    fn build_uncached(&self, spec: &AttnSpec, variant: Variant) -> Result<BuildReport, Error> {
        let (variant, plan) = match plan_variant(spec, variant)? {
            Some(p) => (variant, p),
            // A spec without that variant: its main plan serves the call.
            None => (Variant::Main, crate::plan::plan(spec)?),
        };
        let options = compile_options(&plan);
        let disk_hit =
            |plan, key, cubin, meta| BuildReport::new(spec, variant, plan, key, cubin, meta, Origin::Disk, None);
        let nvrtc_version = match self.nvrtc_version() {
            Ok(v) => v,
            Err(e) => {
                // No NVRTC here (a machine that only runs prebuilt kernels): a
                // CUBIN for this plan built by any NVRTC version will do.
                let any = alias_key(&plan, ANY_NVRTC, &options);
                if let Some(key) = self.read_alias(&any) {
                    if let Lookup::Hit { cubin, meta, .. } = self.cache.get(&key) {
                        return Ok(disk_hit(plan, key, cubin, meta));
                    }
                }
                return Err(e);
            }
        };
        // Fast path of a new process: the alias names the content key without
        // rendering (tera's first render costs ~4 ms).
        let alias = alias_key(&plan, &nvrtc_version, &options);
        if let Some(key) = self.read_alias(&alias) {
            if let Lookup::Hit { cubin, meta, .. } = self.cache.get(&key) {
                return Ok(disk_hit(plan, key, cubin, meta));
            }
        }
        let rendered = render(&plan)?;
        let key = cache_key(&plan, &rendered, &nvrtc_version, &options);
        let mut repaired = None;
        match self.cache.get(&key) {
            Lookup::Hit { cubin, meta, .. } => {
                self.write_aliases(&plan, &alias, &options, &key);
                return Ok(disk_hit(plan, key, cubin, meta));
            }
            Lookup::Corrupt { path, reason } => {
                let msg = format!("corrupt cache entry {} ({reason}); recompiling", path.display());
                eprintln!("attnforge: warning: {msg}");
                repaired = Some(msg);
            }
            Lookup::Miss => {}
        }
        let (cubin, meta) = compile_plan(&plan, &rendered, Nvrtc::get()?)?;
        self.cache.put(&key, &cubin, &meta)?;
        self.write_aliases(&plan, &alias, &options, &key);
        Ok(BuildReport::new(
            spec,
            variant,
            plan,
            key,
            cubin,
            meta,
            Origin::Compiled,
            repaired,
        ))
    }
}

/// Compile a rendered plan to CUBIN and describe it.
pub fn compile_plan(plan: &KernelPlan, rendered: &Rendered, nvrtc: &Nvrtc) -> Result<(Vec<u8>, KernelMeta), Error> {
    let started = Instant::now();
    let out = nvrtc.compile(&CompileRequest {
        source: &rendered.source,
        program_name: &rendered.program_name,
        arch: plan.spec.arch.nvrtc_arch(),
        options: &plan.compile_options,
        emit: Emit::Cubin,
    })?;
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    // The sm90a forward splits the registers a block gets at launch among its
    // roles with setmaxnreg: fewer at launch than the split assumes would
    // hang the consumers, so such a cubin is refused here.
    if plan.template == crate::plan::Template::FwdSm90a {
        let need = crate::plan::sm90a_launch_regs(plan.block_m / 64, plan.min_blocks_per_sm);
        if let Some(r) = out.resources.iter().find(|r| r.registers < need) {
            return Err(Error::RegisterBudget {
                entry: r.entry.clone(),
                got: r.registers,
                need,
            });
        }
    }
    // Registers of the plan's entry; spills and stack over every entry of
    // the module (the sm90a forward's walk, the backward's helpers), so
    // that "no spills" covers all code the launcher may run.
    let mut res = out
        .resources
        .iter()
        .find(|r| r.entry == plan.entry)
        .cloned()
        .unwrap_or_default();
    for r in out.resources.iter().filter(|r| r.entry != plan.entry) {
        res.spill_stores += r.spill_stores;
        res.spill_loads += r.spill_loads;
        res.stack_frame = res.stack_frame.max(r.stack_frame);
    }
    let meta = KernelMeta {
        spec: plan.spec.to_string(),
        entry: plan.entry.clone(),
        arch: plan.spec.arch.nvrtc_arch().to_string(),
        nvrtc_version: nvrtc.version_string(),
        registers: res.registers,
        stack_frame: res.stack_frame,
        spill_stores: res.spill_stores,
        spill_loads: res.spill_loads,
        smem_static: res.smem_static,
        smem_dynamic: plan.smem_bytes,
        compile_ms,
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        log: out.log.clone(),
        cubin_sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.binary)),
        cubin_len: out.binary.len() as u64,
        extra: serde_json::json!({ "plan": plan }),
    };
    Ok((out.binary, meta))
}

/// Compile an explicit plan (a tuning variant, or a template other than the
/// planner's choice) into a kernel, outside the cache and the memo: the key
/// is the one the cache would use, so the kernel stays distinguishable.
pub fn build_plan(plan: KernelPlan) -> Result<CompiledKernel, Error> {
    let rendered = render(&plan)?;
    let nvrtc = Nvrtc::get()?;
    let key = cache_key(&plan, &rendered, &nvrtc.version_string(), &compile_options(&plan));
    let (cubin, meta) = compile_plan(&plan, &rendered, nvrtc)?;
    Ok(CompiledKernel {
        spec: plan.spec,
        variant: Variant::Main,
        plan,
        key,
        cubin,
        meta,
        origin: Origin::Compiled,
    })
}

/// Build (or fetch) the kernel for `spec` with the process-wide cache.
pub fn get_or_build(spec: &AttnSpec) -> Result<Arc<CompiledKernel>, Error> {
    Jit::global().get_or_build(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::CompileError;
    use crate::plan::{default_fwd_tiles, plan, plan_fwd_sm80_with, Template};

    /// NVRTC, or `None` (the test skips and says so) where it is missing and
    /// not required (`ATTNFORGE_REQUIRE_NVRTC`); found but unusable fails.
    fn nvrtc_or_skip() -> Option<&'static Nvrtc> {
        match Nvrtc::get() {
            Ok(n) => Some(n),
            Err(e @ CompileError::NotFound { .. }) => {
                if std::env::var_os("ATTNFORGE_REQUIRE_NVRTC").is_some_and(|v| v != "0") {
                    panic!("ATTNFORGE_REQUIRE_NVRTC is set but NVRTC is missing: {e}");
                }
                println!("skipped: NVRTC not found");
                None
            }
            Err(e) => panic!("NVRTC found but unusable: {e}"),
        }
    }

    #[test]
    fn variants_are_separate_kernels_and_a_missing_one_is_the_main_kernel() {
        if nvrtc_or_skip().is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let jit = Jit::new(Cache::open(CacheConfig::with_user_root(tmp.path())));
        let spec: AttnSpec = "fwd.bf16.d64.causal-br.dense.sm90a".parse().unwrap();
        let main = jit.get_or_build(&spec).unwrap();
        let short = jit.get_or_build_variant(&spec, Variant::ShortKeys).unwrap();
        assert_eq!((main.variant, short.variant), (Variant::Main, Variant::ShortKeys));
        assert_eq!((main.plan.block_m, short.plan.block_m), (192, 64));
        assert_eq!((main.plan.min_blocks_per_sm, short.plan.min_blocks_per_sm), (1, 3));
        assert_ne!(main.key, short.key);
        // Memoized per (spec, variant).
        assert!(Arc::ptr_eq(
            &short,
            &jit.memo_get_variant(&spec, Variant::ShortKeys).unwrap()
        ));
        assert!(Arc::ptr_eq(&main, &jit.memo_get(&spec).unwrap()));
        // A spec without the variant: its main kernel serves the call.
        let none: AttnSpec = "fwd.bf16.d256.none.dense.sm90a".parse().unwrap();
        let k = jit.get_or_build_variant(&none, Variant::ShortKeys).unwrap();
        assert_eq!(k.variant, Variant::Main);
        assert_eq!(k.key, jit.get_or_build(&none).unwrap().key);
    }

    #[test]
    fn sm90a_blocks_launch_with_the_registers_their_setmaxnreg_split_assumes() {
        if nvrtc_or_skip().is_none() {
            return;
        }
        let spec: AttnSpec = "fwd.bf16.d64.causal-br.dense.sm90a".parse().unwrap();
        let base = crate::plan::default_sm90a_tiles(&spec);
        for (consumers, block_n, blocks_per_sm) in [(1, 64, 3), (1, 128, 2), (3, 128, 1)] {
            let plan = crate::plan::plan_fwd_sm90a_with(
                &spec,
                crate::plan::Sm90aFwdTiles {
                    consumers,
                    block_n,
                    blocks_per_sm,
                    ..base
                },
            );
            assert_eq!((plan.block_m, plan.min_blocks_per_sm), (64 * consumers, blocks_per_sm));
            assert_eq!(plan.pingpong, consumers > 1);
            let k = build_plan(plan).unwrap();
            assert_eq!(
                k.meta.registers,
                crate::plan::sm90a_launch_regs(consumers, blocks_per_sm),
                "{consumers} consumers, {blocks_per_sm} blocks per SM"
            );
        }
    }

    #[test]
    fn a_cubin_with_fewer_launch_registers_than_its_split_is_refused() {
        let Some(nvrtc) = nvrtc_or_skip() else {
            return;
        };
        let spec: AttnSpec = "fwd.bf16.d64.causal-br.dense.sm90a".parse().unwrap();
        let three = crate::plan::plan_fwd_sm90a_with(
            &spec,
            crate::plan::Sm90aFwdTiles {
                consumers: 1,
                block_n: 64,
                blocks_per_sm: 3,
                ..crate::plan::default_sm90a_tiles(&spec)
            },
        );
        // Source rendered for three blocks per SM (80 registers at launch),
        // checked against a plan that splits a whole SM's (248).
        let rendered = render(&three).unwrap();
        let one = KernelPlan {
            min_blocks_per_sm: 1,
            ..three
        };
        match compile_plan(&one, &rendered, nvrtc) {
            Err(e @ Error::RegisterBudget { got: 80, need: 248, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("would wait forever") && !msg.contains("  "), "{msg}");
            }
            other => panic!("expected RegisterBudget, got {:?}", other.map(|(_, m)| m.registers)),
        }
    }

    #[test]
    fn build_plan_compiles_a_plan_the_planner_did_not_choose() {
        let Some(nvrtc) = nvrtc_or_skip() else {
            return;
        };
        let spec: AttnSpec = "fwd.bf16.d64.causal-br.dense.sm90a".parse().unwrap();
        let planned = plan(&spec).unwrap();
        assert_eq!(planned.template, Template::FwdSm90a);
        let k = build_plan(plan_fwd_sm80_with(&spec, default_fwd_tiles(&spec))).unwrap();
        assert_eq!((k.spec, k.plan.template), (spec, Template::FwdSm80));
        assert_eq!(&k.cubin[..4], b"\x7fELF");
        assert_eq!(k.meta.spill_stores + k.meta.spill_loads, 0);
        // Its key is not the planner's kernel's: the two never alias in a cache.
        let rendered = render(&planned).unwrap();
        let planned_key = cache_key(&planned, &rendered, &nvrtc.version_string(), &compile_options(&planned));
        assert_ne!(k.key, planned_key);
    }
}
