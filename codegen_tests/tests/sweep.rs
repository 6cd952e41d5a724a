//! The coverage sweep: compile every spec of the default matrix (and its
//! short- and mid-keys variants where it has them) for sm80 and
//! sm90a into a fresh temporary cache (so it really compiles), check the
//! resources, and write `docs/coverage.md`.
//!
//! Needs NVRTC; without it the test skips and says so, unless
//! `ATTNFORGE_REQUIRE_NVRTC=1` (set by `make test`), where it fails.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use attnforge::compile::wgmma_serialized;
use attnforge::compile::Nvrtc;
use attnforge::jit::{Jit, Origin};
use attnforge::plan::{variants, Variant, MID_KEYS_MAX, ONE_CONSUMER_KEYS_MAX, SHORT_KEYS_MAX};
use attnforge::{matrix, Arch, AttnSpec};
use attnforge_cache::{Cache, CacheConfig};

/// (registers, spill bytes, stack bytes, smem bytes, threads, compile ms,
/// wgmma serialized) of one CUBIN: the maximum (spills: the sum) over its
/// entry points.
type Row = (u32, u32, u32, u32, u32, f64, bool);

/// Stack frame allowed per thread (bytes): a few words for the ABI, no arrays.
const MAX_STACK: u32 = 64;

/// NVRTC, or `None` after saying that the test skips (a panic instead when
/// `ATTNFORGE_REQUIRE_NVRTC` is set, as `make test` does).
fn nvrtc_or_skip() -> Option<&'static Nvrtc> {
    match Nvrtc::get() {
        Ok(n) => Some(n),
        Err(e) => {
            if std::env::var_os("ATTNFORGE_REQUIRE_NVRTC").is_some_and(|v| v != "0") {
                panic!("ATTNFORGE_REQUIRE_NVRTC is set but NVRTC is missing: {e}");
            }
            println!("skipped: NVRTC not found ({e})");
            None
        }
    }
}

/// Spilled bytes (stores + loads) summed over every entry of a kernel's CUBIN.
fn spilled(k: &attnforge::jit::CompiledKernel) -> u32 {
    attnforge::compile::parse_ptxas_log(&k.meta.log)
        .iter()
        .map(|e| e.spill_stores + e.spill_loads)
        .sum()
}

/// Compile a plan: `Some(reason)` where it fails, spills or has its wgmmas
/// serialized.
fn plan_faults(spec: &AttnSpec, plan: attnforge::plan::KernelPlan) -> Option<String> {
    let file = plan.template.file();
    match attnforge::jit::build_plan(plan) {
        Ok(k) if spilled(&k) > 0 => Some(format!("{spec}: {} B spilled in {file}", spilled(&k))),
        Ok(k) if wgmma_serialized(&k.meta.log) => Some(format!("{spec}: wgmma serialized by ptxas in {file}")),
        Ok(_) => None,
        Err(e) => Some(format!("{spec} ({file}): {e}")),
    }
}

/// A tune variant's kernel: no spills, its wgmmas not serialized.
fn assert_clean(k: &attnforge::jit::CompiledKernel, what: std::fmt::Arguments) {
    assert_eq!(k.meta.spill_stores + k.meta.spill_loads, 0, "{what} spills");
    assert!(!wgmma_serialized(&k.meta.log), "{what}: wgmma serialized by ptxas");
}

#[test]
fn every_matrix_spec_compiles_without_spills() {
    let Some(nvrtc) = nvrtc_or_skip() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let jit = Jit::new(Cache::open(CacheConfig::with_user_root(tmp.path())));
    let archs = [Arch::Sm80, Arch::Sm90a];
    let specs = matrix::default_specs(&archs);
    assert!(!specs.is_empty());
    // Every kernel a call may take: the planner's, and the short- and
    // mid-keys variants where the spec has them (as `attnforge prebuild`
    // builds them).
    let kernels: Vec<(AttnSpec, Variant)> = specs.iter().flat_map(|s| variants(s).map(move |v| (*s, v))).collect();
    assert!(
        kernels.len() > specs.len(),
        "the matrix has specs with a short-keys variant"
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let rows: Mutex<Vec<(String, Result<Row, String>)>> = Mutex::new(Vec::new());
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(spec, variant)) = kernels.get(i) else { break };
                let r = jit
                    .build_variant(&spec, variant)
                    .map_err(|e| e.to_string())
                    .and_then(|r| {
                        assert_eq!(r.kernel.variant, variant, "{spec}: the variant asked for");
                        assert_eq!(r.origin, Origin::Compiled, "{spec}: a fresh cache must compile");
                        // Every entry takes the parameters the launcher passes
                        // (what launch::load asks the driver on a GPU).
                        let want = attnforge::launch::expected_params(&r.kernel.plan);
                        let entries = attnforge::compile::cubin_params(&r.kernel.cubin)
                            .ok_or_else(|| "the cubin's ELF does not parse".to_string())?;
                        if entries.is_empty() {
                            return Err("the cubin declares no entry".to_string());
                        }
                        if let Some((name, got)) = entries.iter().find(|(_, got)| got.as_slice() != want) {
                            return Err(format!(
                                "entry {name} takes parameters of {got:?} bytes, the launcher passes {want:?}"
                            ));
                        }
                        let m = &r.kernel.meta;
                        // A CUBIN may hold several entry points (the backward's
                        // `_pre`, `_dq`, ...): check the worst of them, not only
                        // the plan's `entry` that the metadata describes.
                        let all = attnforge::compile::parse_ptxas_log(&m.log);
                        let regs = all.iter().map(|k| k.registers).max().unwrap_or(0).max(m.registers);
                        let spill = all
                            .iter()
                            .map(|k| k.spill_stores + k.spill_loads)
                            .sum::<u32>()
                            .max(m.spill_stores + m.spill_loads);
                        let stack = all.iter().map(|k| k.stack_frame).max().unwrap_or(0).max(m.stack_frame);
                        let smem_static = all.iter().map(|k| k.smem_static).max().unwrap_or(0).max(m.smem_static);
                        Ok((
                            regs,
                            spill,
                            stack,
                            m.smem_dynamic + smem_static,
                            r.kernel.plan.threads(),
                            m.compile_ms,
                            wgmma_serialized(&m.log),
                        ))
                    });
                rows.lock().unwrap().push((format!("{spec}{}", variant.suffix()), r));
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let wall = started.elapsed().as_secs_f64();
    let mut failures = Vec::new();
    let mut md = String::new();
    let mut times = Vec::new();
    let _ = writeln!(md, "# Coverage: every spec of `codegen_tests/matrix/default.toml`\n");
    let _ = writeln!(
        md,
        "Written by `make sweep` / `make test` (codegen_tests/tests/sweep.rs): NVRTC {} into a fresh cache, \
         {} specs and {} kernels (`.short` and `.mid`: the variants for keys up to {SHORT_KEYS_MAX}, {MID_KEYS_MAX} at dense d256 causal; up to {ONE_CONSUMER_KEYS_MAX} and of {}..={SHORT_KEYS_MAX} at d <= 64 causal). Checks: compiles, no spills, no wgmma serialized by ptxas, stack <= {MAX_STACK} B, registers <= 255, shared memory within the arch limit, \
         every entry's parameters as the launcher passes them.\n",
        nvrtc.version_string(),
        specs.len(),
        rows.len(),
        ONE_CONSUMER_KEYS_MAX + 1,
    );
    let _ = writeln!(
        md,
        "Compile times are printed by the sweep (stdout), not kept here, so that this file changes only where a \
         kernel's resources do.\n"
    );
    let _ = writeln!(md, "| spec | ok | registers | smem (B) | threads |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (spec, r) in &rows {
        match r {
            Ok((regs, spill, stack, smem, threads, ms, serialized)) => {
                times.push(*ms);
                let spec_only = [Variant::ShortKeys, Variant::MidKeys]
                    .iter()
                    .find_map(|v| spec.strip_suffix(v.suffix()))
                    .unwrap_or(spec);
                let arch: Arch = spec_only.rsplit('.').next().unwrap().parse().unwrap();
                let mut bad = Vec::new();
                if *spill > 0 {
                    bad.push(format!("{spill} B spilled"));
                }
                if *serialized {
                    bad.push("wgmma serialized by ptxas".to_string());
                }
                if *stack > MAX_STACK {
                    bad.push(format!("stack {stack} B"));
                }
                if *regs > 255 {
                    bad.push(format!("{regs} registers"));
                }
                if *smem > arch.max_smem_per_block() {
                    bad.push(format!("smem {smem} B over {}", arch.max_smem_per_block()));
                }
                let _ = writeln!(
                    md,
                    "| `{spec}` | {} | {regs} | {smem} | {threads} |",
                    if bad.is_empty() {
                        "ok".to_string()
                    } else {
                        bad.join(", ")
                    }
                );
                if !bad.is_empty() {
                    failures.push(format!("{spec}: {}", bad.join(", ")));
                }
            }
            Err(e) => {
                let _ = writeln!(md, "| `{spec}` | FAILED | | | |");
                failures.push(format!("{spec}: {e}"));
            }
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
    let slowest = times.last().copied().unwrap_or(0.0);
    println!(
        "sweep: {} specs, {} kernels in {wall:.1}s with {jobs} jobs; compile median {median:.0} ms, slowest {slowest:.0} ms",
        specs.len(),
        rows.len()
    );
    let verify = jit.cache().verify();
    assert!(
        verify.is_clean(),
        "fresh sweep cache does not verify: {:?}",
        verify.issues
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/coverage.md");
    std::fs::write(&path, md).unwrap();
    assert!(
        failures.is_empty(),
        "{} specs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The sm90a forward's consumer schedules that no default plan uses (one
/// tile at a time; pipelined without ping-pong; persistent), on two consumer
/// warpgroups, the other tile order and consumer count stay compilable,
/// spill-free and with their wgmmas not serialized: `gpu_bench --tune90`
/// times them against the default.
#[test]
fn sm90a_forward_schedule_variants_compile_without_spills() {
    use attnforge::plan::{default_sm90a_tiles, plan_fwd_sm90a_with, Sm90aFwdTiles};
    use attnforge::{AttnSpec, DType, Layout, Mask};
    if nvrtc_or_skip().is_none() {
        return;
    }
    for (d, mask, layout) in [
        (64, Mask::CausalBottomRight, Layout::Thd),
        (128, Mask::None, Layout::Dense),
        (256, Mask::SlidingWindow, Layout::Dense),
    ] {
        let spec = AttnSpec::fwd(DType::Bf16, d, mask, layout, Arch::Sm90a);
        let planned = default_sm90a_tiles(&spec);
        // Two consumer warpgroups (the default above d64; at d64 with the
        // block_n it had as the default before three became it).
        let base = Sm90aFwdTiles {
            consumers: 2,
            block_n: if d <= 64 { 192 } else { planned.block_n },
            ..planned
        };
        for (pipelined, pingpong, persistent) in [
            (false, false, false),
            (true, false, false),
            (false, false, true),
            (true, true, true),
        ] {
            let tiles = Sm90aFwdTiles {
                pipelined,
                pingpong,
                persistent,
                ..base
            };
            let plan = plan_fwd_sm90a_with(&spec, tiles);
            assert_eq!((plan.consumer_pipelined, plan.pingpong), (pipelined, pingpong));
            assert_eq!(plan.grid == attnforge::plan::GridRule::TilesOrWalk, persistent);
            let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
            assert_clean(&k, format_args!("{spec} {tiles:?}"));
            assert!(k.meta.registers > 0, "{spec} {tiles:?}: no ptxas resources");
        }
        // The other tile order than the planner's, with the other row sums
        // and causal alignment (as the GPU suite runs it).
        let tiles = Sm90aFwdTiles {
            head_major: !planned.head_major,
            rowsum_mma: !planned.rowsum_mma,
            tail_first: !planned.tail_first,
            ..planned
        };
        let plan = plan_fwd_sm90a_with(&spec, tiles);
        assert_eq!(plan.head_major, !planned.head_major);
        let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
        assert_clean(&k, format_args!("{spec} {tiles:?}"));
        // Three consumer warpgroups (160 registers each) where S, P and O fit.
        if d <= 128 {
            let tiles = Sm90aFwdTiles {
                consumers: 3,
                block_n: if d <= 64 { 128 } else { 80 },
                ..planned
            };
            let plan = plan_fwd_sm90a_with(&spec, tiles);
            assert_eq!((plan.block_m, plan.num_warps), (192, 16));
            let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
            assert_clean(&k, format_args!("{spec} {tiles:?}"));
        }
    }
    // The clusters-of-two option (K/V multicast) on the no-mask dense specs
    // that take it: d128, d256 and (192, 128), whose three column chunks
    // split 2 + 1 between the pair.
    for (dqk, dv) in [(128u16, 128u16), (256, 256), (192, 128)] {
        let spec = AttnSpec {
            head_dim_qk: dqk,
            head_dim_v: dv,
            ..AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm90a)
        };
        let tiles = Sm90aFwdTiles {
            cluster: true,
            ..default_sm90a_tiles(&spec)
        };
        let plan = plan_fwd_sm90a_with(&spec, tiles);
        assert_eq!(plan.cluster_m, 2, "{spec}");
        let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
        assert_clean(&k, format_args!("{spec} {tiles:?}"));
    }
    // O through shared memory by TMA stores (off by default; dense) where
    // the staging fits: d64's three consumers (with the end-aligned causal
    // blocks too), d128 on three at block_n 80 and on two at 128, a head dim
    // not a multiple of 64, and d_v 128 under d_qk 192.
    for (spec, tail_first) in [
        ("fwd.bf16.d64.causal-br.dense.sm90a", true),
        ("fwd.f16.d128.causal-tl.dense.sm90a", false),
        ("fwd.bf16.d128.window.dense.softcap.sm90a", false),
        ("fwd.bf16.d40.none.dense.sm90a", false),
        ("fwd.bf16.d192v128.causal-br.dense.sm90a", false),
    ] {
        let spec: AttnSpec = spec.parse().unwrap();
        let tiles = Sm90aFwdTiles {
            tma_store_o: true,
            tail_first,
            ..default_sm90a_tiles(&spec)
        };
        let plan = plan_fwd_sm90a_with(&spec, tiles);
        assert!(plan.tma_store_o, "{spec}: the staging fits");
        let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
        assert_clean(&k, format_args!("{spec} {tiles:?}"));
    }
    // Q in registers (planned on the short-keys causal tiles, an option
    // elsewhere up to d128) on two consumers at block_n 128, as the GPU suite
    // runs it on every case: ragged, windows, softcap (tanh's registers
    // beside Q's), a head dim that is not a multiple of 64, f16.
    for spec in [
        "fwd.bf16.d128.none.dense.sm90a",
        "fwd.bf16.d128.causal-br.thd.sm90a",
        "fwd.bf16.d128.window.dense.softcap.sm90a",
        "fwd.f16.d96.causal-tl.dense.sm90a",
        "fwd.bf16.d64.none.thd.softcap.sm90a",
    ] {
        let spec: AttnSpec = spec.parse().unwrap();
        let tiles = Sm90aFwdTiles {
            q_regs: true,
            consumers: 2,
            block_n: 128,
            stages: 2,
            blocks_per_sm: 1,
            ..default_sm90a_tiles(&spec)
        };
        let plan = plan_fwd_sm90a_with(&spec, tiles);
        assert!(plan.q_regs, "{spec}: up to d128");
        let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} {tiles:?}: {e}"));
        assert_clean(&k, format_args!("{spec} {tiles:?}"));
    }
}

/// Where an sm90a backward spec can run on either template (the GPU suite
/// runs both), the one the planner did not take stays compilable and
/// spill-free too: the sm80 instruction path where the planner takes wgmma
/// (`bwd_sm90a.cu`, compiled by the matrix sweep above), and the wgmma
/// backward where the planner routes the spec to `bwd_sm80.cu` (dense d <= 64
/// causal, measured faster there).
#[test]
fn the_other_backward_template_stays_spill_free_where_both_can_run() {
    use attnforge::plan::plan_bwd::{plan_bwd_sm80, plan_bwd_sm90a};
    use attnforge::plan::Template;
    use attnforge::Direction;
    if nvrtc_or_skip().is_none() {
        return;
    }
    let specs: Vec<_> = matrix::default_specs(&[Arch::Sm90a])
        .into_iter()
        .filter(|s| s.direction == Direction::Bwd && plan_bwd_sm90a(s).is_ok())
        .collect();
    let routed = specs
        .iter()
        .filter(|s| attnforge::plan(s).unwrap().template == Template::BwdSm80)
        .count();
    assert!(
        routed > 0 && routed < specs.len(),
        "the matrix has backward specs on both templates ({routed} of {} routed to bwd_sm80)",
        specs.len()
    );
    let mut failures = Vec::new();
    for spec in &specs {
        let other = match attnforge::plan(spec).unwrap().template {
            Template::BwdSm90a => plan_bwd_sm80(spec).unwrap_or_else(|| panic!("{spec}: no sm80-path plan")),
            Template::BwdSm80 => plan_bwd_sm90a(spec).unwrap(),
            t => panic!("{spec}: planned on {t:?}"),
        };
        failures.extend(plan_faults(spec, other));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The sm80-path forward of the sm90a specs that the GPU benchmark measures
/// for issue 3 (`attnforge compile --path sm80`: the mma.sync template on the
/// H100/H200, where the planner itself takes wgmma) compiles spill-free too,
/// so that the figures compared with FlashAttention-2 are of kernels the
/// coverage rules would accept.
#[test]
fn sm80_path_forward_of_the_benchmarked_sm90a_specs_is_spill_free() {
    if nvrtc_or_skip().is_none() {
        return;
    }
    let mut failures = Vec::new();
    let mut n = 0;
    for dtype in ["bf16", "f16"] {
        for d in [64, 128, 256] {
            for (mask, layout) in [
                ("none", "dense"),
                ("causal-tl", "dense"),
                ("none", "thd"),
                ("causal-br", "thd"),
            ] {
                let spec: AttnSpec = format!("fwd.{dtype}.d{d}.{mask}.{layout}.sm90a").parse().unwrap();
                // The plan `attnforge compile --path sm80` builds.
                let plan = attnforge::plan::plan_sm80_path(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
                n += 1;
                failures.extend(plan_faults(&spec, plan));
            }
        }
    }
    println!("{n} sm80-path forwards of sm90a specs compiled");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The wgmma backward's 128-row query tiles (an option at d <= 64, the
/// warpgroups splitting dQ's rows) compile spill-free, and are refused above
/// d64 with a reason.
#[test]
fn sm90a_backward_tall_query_tiles_compile_without_spills() {
    use attnforge::plan::plan_bwd::{plan_bwd_sm90a_with, Sm90aBwdOptions};
    if nvrtc_or_skip().is_none() {
        return;
    }
    let tall = Sm90aBwdOptions { tall_query_tiles: true };
    for s in [
        "bwd.bf16.d64.none.dense.sm90a",
        "bwd.f16.d64.causal-br.thd.sm90a",
        "bwd.bf16.d64.window.dense.softcap.sm90a",
        "bwd.bf16.d32.causal-tl.thd.softcap.sm90a",
    ] {
        let spec: attnforge::AttnSpec = s.parse().unwrap();
        let plan = plan_bwd_sm90a_with(&spec, tall).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(plan.block_m, 128);
        let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(spilled(&k), 0, "{s}: spills");
    }
    let d128: attnforge::AttnSpec = "bwd.bf16.d128.none.dense.sm90a".parse().unwrap();
    assert!(plan_bwd_sm90a_with(&d128, tall).unwrap_err().contains("d <= 64"));
}
