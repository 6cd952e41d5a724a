//! Times the generated forward kernels on the GPU (CUDA events, median of
//! repeated launches) over the standard sweep, and writes JSON rows that
//! `scripts/gpu_bench.py` puts next to the peers measured in the same run.
//!
//! Standard sweep (as in the FlashAttention papers and ../shared/baselines):
//! d ∈ {64, 128, 256} × seqlen ∈ {512, 2k, 8k, 16k} × causal, batch·seqlen =
//! 16k tokens, heads·d = 2048, bf16, BHSD; plus a ragged THD sweep.
//!
//! usage: gpu_bench [--quick] [OUT_JSON] | --tune | --tune90 | --trace90 | --trace80b | --trace80f | --phases | --ragged-order
//!        | --ab DIR[,DIR...]
//!        | --one SPEC [--path sm80] [--seqlen S]   (one kernel, fixed launch sequence: profilers)
//!
//! --tune90 reads ATTNFORGE_TUNE90_D (head dims of 64, 128, 256), ATTNFORGE_TUNE90_S (lengths of
//! 512, 2048, 8192, 16384, and 768, 1024 or 4096 when named), ATTNFORGE_TUNE90_ROUNDS (3) and
//! ATTNFORGE_TUNE90_LEAN=1 (the planner's tiles and the alternatives only, no option flips),
//! ATTNFORGE_TUNE90_ALT (the alternatives instead of the built-in list, as comma-separated
//! CONSUMERS:BLOCK_N:STAGES:BLOCKS_PER_SM) and ATTNFORGE_TUNE90_QREGS=1 (every variant also with
//! Q in registers, where its plan takes it).

use std::time::Instant;

use attnforge::launch::{self, FwdArgs, FwdProblem, TensorArg};
use attnforge::launch_bwd;
use attnforge::{Arch, AttnSpec, DType, Layout, Mask};
use cudarc::driver::{result, sys};
use rand::{Rng, SeedableRng};

struct Dev(u64);
impl Dev {
    fn random(n: usize, rng: &mut rand::rngs::StdRng) -> Dev {
        // Standard normal (Box-Muller, two values a pair), as the peers' torch.randn inputs.
        let mut host: Vec<u16> = Vec::with_capacity(n + 1);
        while host.len() < n {
            let (u, v): (f32, f32) = (rng.gen_range(f32::EPSILON..1.0), rng.gen_range(0.0..1.0));
            let (r, (sin, cos)) = ((-2.0 * u.ln()).sqrt(), (std::f32::consts::TAU * v).sin_cos());
            host.push(half::bf16::from_f32(r * cos).to_bits());
            host.push(half::bf16::from_f32(r * sin).to_bits());
        }
        host.truncate(n);
        Dev::upload(&host)
    }
    fn upload(host: &[u16]) -> Dev {
        // SAFETY: device allocation and copy of `host.len()` elements.
        unsafe {
            let p = result::malloc_sync(host.len() * 2).expect("alloc");
            result::memcpy_htod_sync(p, host).expect("htod");
            Dev(p)
        }
    }
    fn zeroed(bytes: usize) -> Dev {
        // SAFETY: device allocation.
        unsafe {
            let p = result::malloc_sync(bytes).expect("alloc");
            result::memset_d8_sync(p, 0, bytes).expect("memset");
            Dev(p)
        }
    }
}
impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: allocated above.
        unsafe {
            let _ = result::free_sync(self.0);
        }
    }
}

/// The median of `v` (upper middle for an even count).
fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted[sorted.len() / 2]
}

/// `n` CUDA events, destroyed when dropped.
struct Events(Vec<sys::CUevent>);
impl Events {
    fn new(n: usize) -> Events {
        Events(
            (0..n)
                .map(|_| result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).expect("event"))
                .collect(),
        )
    }
    /// Milliseconds from event `a` to event `b` (both recorded and complete).
    fn ms(&self, a: usize, b: usize) -> f64 {
        // SAFETY: events of this context, recorded by the caller.
        unsafe { result::event::elapsed(self.0[a], self.0[b]).expect("elapsed") as f64 }
    }
}
impl Drop for Events {
    fn drop(&mut self) {
        for &e in &self.0 {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { result::event::destroy(e) };
        }
    }
}

/// The rows of a balanced Latin square (Williams) for `n` modules: over the
/// rows each module runs right after every other one equally often (`n` rows
/// for even `n`, `2n` for odd).
fn williams(n: usize) -> Vec<Vec<usize>> {
    let mut first = vec![0];
    let (mut lo, mut hi) = (1, n.saturating_sub(1));
    while first.len() < n {
        first.push(lo);
        lo += 1;
        if first.len() < n {
            first.push(hi);
            hi -= 1;
        }
    }
    let mut rows: Vec<Vec<usize>> = (0..n).map(|r| first.iter().map(|x| (x + r) % n).collect()).collect();
    if n % 2 == 1 {
        let rev: Vec<Vec<usize>> = rows.iter().map(|r| r.iter().rev().copied().collect()).collect();
        rows.extend(rev);
    }
    rows
}

/// Median milliseconds of one launch of `f`, timed as `triton.testing.do_bench`
/// times the peers in scripts/gpu_bench.py: every launch after a 256 MB write
/// that evicts L2, between its own pair of events; the launch count from a
/// five-launch estimate, to fill about `warmup_ms` of warm-up and `rep_ms`
/// of timed launches.
fn time_ms(mut f: impl FnMut(), warmup_ms: f64, rep_ms: f64) -> f64 {
    const FLUSH: usize = 256 << 20;
    static FLUSH_BUF: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: one device buffer for the life of the process; writes on the legacy default stream.
    let flush = *FLUSH_BUF.get_or_init(|| unsafe { result::malloc_sync(FLUSH).expect("alloc") });
    let evict = || unsafe { result::memset_d8_async(flush, 0, FLUSH, std::ptr::null_mut()).expect("memset") };
    // SAFETY (records below): events of this context on the legacy default stream.
    let record = |e: sys::CUevent| unsafe { result::event::record(e, std::ptr::null_mut()).expect("record") };
    let sync = |e: sys::CUevent| unsafe { result::event::synchronize(e).expect("sync") };
    f();
    let est = Events::new(2);
    record(est.0[0]);
    for _ in 0..5 {
        evict();
        f();
    }
    record(est.0[1]);
    sync(est.0[1]);
    let estimate = est.ms(0, 1) / 5.0;
    let n_warm = ((warmup_ms / estimate) as usize).max(1);
    let n_rep = ((rep_ms / estimate) as usize).clamp(1, 1000);
    for _ in 0..n_warm {
        evict();
        f();
    }
    let marks = Events::new(2 * n_rep);
    for i in 0..n_rep {
        evict();
        record(marks.0[2 * i]);
        f();
        record(marks.0[2 * i + 1]);
    }
    sync(marks.0[2 * n_rep - 1]);
    median(&(0..n_rep).map(|i| marks.ms(2 * i, 2 * i + 1)).collect::<Vec<_>>())
}

/// Median milliseconds per launch of `f` over `iters` launches back to back
/// (no L2 eviction, no gaps), `reps` times: the figure of earlier sessions'
/// tables, printed beside the do_bench-style one.
fn time_back_to_back_ms(mut f: impl FnMut(), iters: usize, reps: usize) -> f64 {
    for _ in 0..3 {
        f();
    }
    let ev = Events::new(2);
    let mut v = Vec::new();
    for _ in 0..reps {
        // SAFETY: events of this context on the legacy default stream.
        unsafe {
            result::event::record(ev.0[0], std::ptr::null_mut()).expect("record");
            for _ in 0..iters {
                f();
            }
            result::event::record(ev.0[1], std::ptr::null_mut()).expect("record");
            result::event::synchronize(ev.0[1]).expect("sync");
        }
        v.push(ev.ms(0, 1) / iters as f64);
    }
    median(&v)
}

/// " short-keys" / " mid-keys" for a per-call variant; empty for the main plan.
fn variant_label(v: attnforge::plan::Variant) -> &'static str {
    match v {
        attnforge::plan::Variant::ShortKeys => " short-keys",
        attnforge::plan::Variant::MidKeys => " mid-keys",
        _ => "",
    }
}

/// The sm90a forward's consumers and block_n, its blocks per SM where more
/// than one, and the variant, for the bench's template column.
fn tile_label(k: &attnforge::CompiledKernel) -> String {
    if k.plan.template != attnforge::plan::Template::FwdSm90a {
        return String::new();
    }
    format!(
        " {}x64 bn{}{}{}",
        k.plan.block_m / 64,
        k.plan.block_n,
        if k.plan.min_blocks_per_sm > 1 {
            format!(" {}/SM", k.plan.min_blocks_per_sm)
        } else {
            String::new()
        },
        variant_label(k.variant)
    )
}

/// " (walk)" or " (one tile)" where the kernel has both entries: the one the
/// launcher takes for `fa`; empty otherwise.
fn entry_of(lk: &launch::LoadedKernel, fa: &FwdArgs) -> &'static str {
    match (lk.has_walk(), lk.walks(fa), lk.pairs(fa)) {
        (true, Ok(true), _) => " (walk)",
        (true, _, Ok(true)) => " (one tile, pairs)",
        (true, _, _) => " (one tile)",
        _ => "",
    }
}

/// Forward arguments of a dense self-attention problem in contiguous BHSD.
fn bhsd_args(qkvo: [u64; 4], lse: u64, b: usize, h: usize, s: usize, d: usize) -> FwdArgs {
    let t = |p| TensorArg::bhsd(p, s as i64, h as i64, d as i64);
    FwdArgs {
        q: t(qkvo[0]),
        k: t(qkvo[1]),
        v: t(qkvo[2]),
        o: t(qkvo[3]),
        lse: Some(lse),
        problem: FwdProblem {
            batch: b as u32,
            heads_q: h as u32,
            heads_kv: h as u32,
            seqlen_q: s as u32,
            seqlen_k: s as u32,
            window: (-1, -1),
            ..Default::default()
        },
    }
}

/// Build a kernel for `spec` with an explicit tile shape (tuning), or None when it does not build.
fn build_variant(spec: &AttnSpec, tiles: attnforge::plan::FwdTiles) -> Option<attnforge::CompiledKernel> {
    // Spilling variants are timed too (the tune line says how much): a spill
    // of a loop-invariant value may cost nothing, and the figure tells
    // whether making the shape spill-free is worth the work.
    attnforge::jit::build_plan(attnforge::plan::plan_fwd_sm80_with(spec, tiles)).ok()
}

/// TFLOP/s of the sm80 instruction path on `fa` when the planner chose
/// another template for `spec` (the wgmma forward on sm90a), else None.
fn time_sm80_path(spec: &AttnSpec, planned: &attnforge::CompiledKernel, fa: &FwdArgs, flops: f64) -> Option<f64> {
    use attnforge::plan::{default_fwd_tiles, Template};
    if planned.plan.template == Template::FwdSm80 {
        return None;
    }
    // Timed even when ptxas for sm_90 spills a little (d128 dense unmasked:
    // 32 B; the sm_80 build that the sweep checks does not): this column is
    // the sm80 instruction path's figure on the H200 (issue 3).
    let k = attnforge::jit::build_plan(attnforge::plan::plan_fwd_sm80_with(spec, default_fwd_tiles(spec))).ok()?;
    let spills = k.meta.spill_stores + k.meta.spill_loads;
    if spills > 0 {
        println!("{spec}: sm80 path on sm_90 spills {spills} B (timed anyway)");
    }
    let lk = launch::load(&k).ok()?;
    // SAFETY: the caller's buffers are sized for the problem in `fa`.
    let ms = time_ms(
        || unsafe { launch::launch_fwd(&lk, fa, std::ptr::null_mut()).expect("launch") },
        25.0,
        100.0,
    );
    let tf = flops / ms / 1e9;
    println!("{spec:<40} sm80 path {ms:8.3} ms {tf:7.1} TFLOP/s");
    Some(tf)
}

/// Time tile-shape variants per head dim (tuning; `--tune`), each in both
/// block orders, at seqlen 2k and 8k (`ATTNFORGE_TUNE_S=2048,8192`; 16k
/// tokens per head dim, so b = 16384 / s; `ATTNFORGE_TUNE_D` narrows the head
/// dims). The variants of one problem are timed in interleaved rounds
/// (`ATTNFORGE_TUNE_ROUNDS`, default 3; each round's order from a balanced
/// Latin square, `williams`) and the
/// line reports the median with every round: one variant after another drifts
/// with the clock by a few percent on this path.
fn tune(arch: Arch, rng: &mut rand::rngs::StdRng) {
    use attnforge::plan::FwdTiles;
    let env_list = |name: &str, default: &[usize]| -> Vec<usize> {
        std::env::var(name)
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| default.to_vec())
    };
    let seqlens = env_list("ATTNFORGE_TUNE_S", &[2048, 8192]);
    let rounds = env_list("ATTNFORGE_TUNE_ROUNDS", &[3])
        .first()
        .copied()
        .unwrap_or(3)
        .max(1);
    // ATTNFORGE_TUNE_D: a comma list narrowing the head dims.
    for d in env_list("ATTNFORGE_TUNE_D", &[64, 128, 256]) {
        let h = 2048 / d;
        // Built once per head dim and mask (the seqlen is a launch argument).
        for causal in [false, true] {
            let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
            let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, arch);
            let shapes = attnforge::plan::fwd_tile_candidates(&spec);
            let planner = attnforge::plan::default_fwd_tiles(&spec);
            let mut built = Vec::new();
            for shape in &shapes {
                for head_major in [false, true] {
                    let tiles = FwdTiles { head_major, ..*shape };
                    let Some(k) = build_variant(&spec, tiles) else {
                        println!("tune d={d:<3} causal={causal:<5} {tiles:?}: does not build");
                        continue;
                    };
                    let lk = launch::load(&k).expect("load");
                    built.push((tiles, k, lk));
                }
            }
            for &s in &seqlens {
                let b = (16384 / s).max(1);
                let (_buffers, fa) = fwd_problem(b, h, s, d, rng);
                let flops = 4.0 * (b * h * s * s * d) as f64 * if causal { 0.5 } else { 1.0 };
                let mut tf = vec![Vec::new(); built.len()];
                let square = williams(built.len());
                for round in 0..rounds {
                    for &i in &square[round % square.len()] {
                        let lk = &built[i].2;
                        // SAFETY: buffers sized for the problem.
                        let ms = time_ms(
                            || unsafe { launch::launch_fwd(lk, &fa, std::ptr::null_mut()).expect("launch") },
                            10.0,
                            40.0,
                        );
                        tf[i].push(flops / ms / 1e9);
                    }
                }
                for ((tiles, k, _), r) in built.iter().zip(&tf) {
                    let med = median(r);
                    let all: Vec<String> = r.iter().map(|x| format!("{x:.0}")).collect();
                    println!(
                        "tune d={d:<3} s={s:<5} causal={causal:<5} warps={} mt={} bn={:<3} stages={}{}{} regs={:<3} spills={:<3} smem={:<6} {med:6.1} TFLOP/s (rounds {})",
                        tiles.num_warps,
                        tiles.m_tiles_per_warp,
                        k.plan.block_n,
                        k.plan.stages,
                        if k.plan.head_major { "" } else { " qbm" },
                        if *tiles == planner { " planner" } else { "" },
                        k.meta.registers,
                        k.meta.spill_stores + k.meta.spill_loads,
                        k.plan.smem_bytes,
                        all.join(" ")
                    );
                }
            }
        }
    }
}

/// The sm90a forward's variants (tuning; `--tune90`): per head dim the
/// planner's tiles, one block per work tile and persistent (one block per
/// SM walking the tiles), and any listed alternatives; built and checked for
/// spills first (works without a GPU; `ATTNFORGE_TUNE_CUBINS=DIR` writes
/// their cubins there), then timed at seqlen 512..16k, causal and not.
fn tune90(rng: &mut rand::rngs::StdRng) {
    use attnforge::plan::{default_sm90a_tiles, plan_fwd_sm90a_with, Sm90aFwdTiles};
    // Alternatives to the planner's tiles per head dim, as (consumer
    // warpgroups, block_n, stages, blocks per SM) on the planner's other
    // options: the other consumer count (3 warpgroups are the default at
    // d <= 64, block_m 192), block_n (the short ones for short keys), and
    // since session 38 one consumer with several blocks per SM (each with the
    // SM's registers and shared memory divided by the count). Every variant
    // has both entries, each timed; those that spill are dropped below.
    type Shape = (u32, u32, u32, u32);
    let alternatives: &[(usize, &[Shape])] = &[
        (
            64,
            &[
                (2, 192, 3, 1),
                (3, 112, 3, 1),
                (2, 128, 3, 1),
                (2, 128, 2, 1),
                (2, 96, 3, 1),
                (2, 64, 4, 1),
                (1, 64, 2, 3),
                (1, 128, 2, 2),
                (1, 64, 3, 2),
                (1, 128, 3, 2),
                (2, 64, 2, 2),
            ],
        ),
        (
            128,
            &[
                (2, 160, 2, 1),
                (2, 176, 2, 1),
                (2, 128, 2, 1),
                (2, 96, 2, 1),
                (2, 64, 3, 1),
                (3, 64, 2, 1),
                (3, 80, 2, 1),
                (3, 80, 3, 1),
                (3, 80, 4, 1),
                (3, 96, 2, 1),
                (3, 64, 3, 1),
                (1, 64, 2, 2),
                (1, 96, 2, 2),
                (1, 64, 3, 2),
            ],
        ),
        (256, &[(2, 64, 2, 1), (2, 48, 3, 1), (2, 96, 2, 1)]),
    ];
    // ATTNFORGE_TUNE90_D / _S: comma lists narrowing the head dims and
    // lengths to some of the standard ones; anything else is refused.
    let list = |var: &str, all: &[usize]| -> Vec<usize> {
        let Some(v) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) else {
            return all.to_vec();
        };
        v.split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(n) if all.contains(&n) || (var.ends_with("_S") && matches!(n, 768 | 1024 | 4096)) => n,
                _ => panic!(
                    "{var}={v}: `{x}` is not one of {all:?}{}",
                    if var.ends_with("_S") { " or 768, 1024, 4096" } else { "" }
                ),
            })
            .collect()
    };
    // ATTNFORGE_TUNE90_ALT: the alternatives of every head dim of the run.
    let alt_env: Option<Vec<Shape>> = std::env::var("ATTNFORGE_TUNE90_ALT")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.split(',')
                .map(|x| {
                    let n: Vec<u32> = x
                        .split(':')
                        .map(|f| {
                            f.trim()
                                .parse()
                                .unwrap_or_else(|_| panic!("ATTNFORGE_TUNE90_ALT: `{x}`"))
                        })
                        .collect();
                    match n[..] {
                        [c, bn, st, bps] => (c, bn, st, bps),
                        _ => panic!("ATTNFORGE_TUNE90_ALT: `{x}` is not CONSUMERS:BLOCK_N:STAGES:BLOCKS_PER_SM"),
                    }
                })
                .collect()
        });
    let q_regs_too = std::env::var("ATTNFORGE_TUNE90_QREGS").is_ok_and(|v| v == "1");
    let dims = list("ATTNFORGE_TUNE90_D", &[64, 128, 256]);
    let lens = list("ATTNFORGE_TUNE90_S", &[512, 2048, 8192, 16384]);
    // 768 (the one-consumer short-keys tiles' limit), 1024 (the short-keys
    // variant's) and 4096 (past the mid-keys variant's) only when asked for.
    let mut built = Vec::new();
    let mut todo = Vec::new();
    for &d in &dims {
        for causal in [false, true] {
            let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
            let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, Arch::Sm90a);
            let base = default_sm90a_tiles(&spec);
            // The planner's tiles, also as a module with the one-tile entry
            // alone (does the walk entry beside it cost the one-tile entry?),
            // and in the other tile order.
            // ATTNFORGE_TUNE90_LEAN=1: the planner's tiles and the
            // alternatives below only (no option flips).
            let lean = std::env::var("ATTNFORGE_TUNE90_LEAN").is_ok_and(|v| v == "1");
            let mut tiles = vec![base];
            if !lean {
                tiles.push(Sm90aFwdTiles {
                    persistent: false,
                    ..base
                });
                tiles.push(Sm90aFwdTiles {
                    head_major: !base.head_major,
                    ..base
                });
            }
            // The other causal alignment (end or start) and the other row sums
            // (tensor cores or FADD) than the planner's, where the spec has them.
            let flip_tail = Sm90aFwdTiles {
                tail_first: !base.tail_first,
                ..base
            };
            if !lean && plan_fwd_sm90a_with(&spec, flip_tail).tail_first != plan_fwd_sm90a_with(&spec, base).tail_first
            {
                tiles.push(flip_tail);
            }
            let flip_sums = Sm90aFwdTiles {
                rowsum_mma: !base.rowsum_mma,
                ..base
            };
            if !lean && plan_fwd_sm90a_with(&spec, flip_sums).rowsum_mma != plan_fwd_sm90a_with(&spec, base).rowsum_mma
            {
                tiles.push(flip_sums);
            }
            // O through shared memory by TMA stores (the other way than the
            // planner's), where its staging fits.
            let flip_tma_o = Sm90aFwdTiles {
                tma_store_o: !base.tma_store_o,
                ..base
            };
            if plan_fwd_sm90a_with(&spec, flip_tma_o).tma_store_o != plan_fwd_sm90a_with(&spec, base).tma_store_o {
                tiles.push(flip_tma_o);
            }
            // The short-keys variant (plan::short_keys_tiles) and, where its
            // staging fits, the same with TMA stores of O: the option's
            // predicted gain is at short keys, where calls take the variant.
            if let Some(short) = attnforge::plan::short_keys_tiles(&spec) {
                let short_tma_o = Sm90aFwdTiles {
                    tma_store_o: !short.tma_store_o,
                    ..short
                };
                if !tiles.contains(&short) {
                    tiles.push(short);
                }
                if plan_fwd_sm90a_with(&spec, short_tma_o).tma_store_o != plan_fwd_sm90a_with(&spec, short).tma_store_o
                {
                    tiles.push(short_tma_o);
                }
            }
            // The mid-keys variant's tiles (plan::mid_keys_tiles), where the
            // spec has one and they are not among the alternatives below.
            if let Some(mid) = attnforge::plan::mid_keys_tiles(&spec) {
                if !tiles.contains(&mid) {
                    tiles.push(mid);
                }
            }
            // The clusters-of-two option (K/V multicast) where the spec takes
            // it: its one-tile entry is timed as pairs and alone.
            let pairs = Sm90aFwdTiles { cluster: true, ..base };
            if !lean && plan_fwd_sm90a_with(&spec, pairs).cluster_m > 1 {
                tiles.push(pairs);
            }
            let alts: &[Shape] = match &alt_env {
                Some(v) => v,
                None => alternatives.iter().find(|(ad, _)| *ad == d).map_or(&[], |(_, v)| *v),
            };
            for &(consumers, block_n, stages, blocks_per_sm) in alts {
                let t = Sm90aFwdTiles {
                    consumers,
                    block_n,
                    stages,
                    blocks_per_sm,
                    ..base
                };
                if !tiles.contains(&t) {
                    tiles.push(t);
                }
            }
            // Q in registers on every variant above, where the plan takes it.
            if q_regs_too {
                for t in tiles.clone() {
                    let on = Sm90aFwdTiles { q_regs: true, ..t };
                    if plan_fwd_sm90a_with(&spec, on).q_regs && !tiles.contains(&on) {
                        tiles.push(on);
                    }
                }
            }
            for tiles in tiles {
                todo.push((d, causal, spec, tiles));
            }
        }
    }
    // NVRTC compiles one source per thread: build the variants on every core.
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(todo.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(d, causal, spec, tiles)) = todo.get(i) else {
                    break;
                };
                let r = attnforge::jit::build_plan(plan_fwd_sm90a_with(&spec, tiles));
                results.lock().expect("results").push((i, d, causal, spec, tiles, r));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|r| r.0);
    for (_, d, causal, spec, tiles, r) in results {
        let k = match r {
            Ok(k) => k,
            Err(e) => {
                println!("tune90 {spec} {tiles:?}: {e}");
                continue;
            }
        };
        let (bn, st, pp) = (k.plan.block_n, k.plan.stages, k.plan.pingpong);
        let spills = k.meta.spill_stores + k.meta.spill_loads;
        // ptxas's C7510..C7515: every wgmma waited for (timed anyway, marked).
        let serialized = attnforge::compile::wgmma_serialized(&k.meta.log);
        println!(
            "tune90 {spec} {tiles:?}: bn={bn} stages={st} pingpong={pp} regs={} spills={spills} B{}",
            k.meta.registers,
            if serialized { " WGMMA SERIALIZED" } else { "" }
        );
        if let Some(dir) = std::env::var_os("ATTNFORGE_TUNE_CUBINS") {
            // For reading the machine code (cuobjdump --dump-sass) without a GPU.
            let name = format!(
                "{spec}.c{}.bn{bn}.st{st}{}{}{}{}{}.cubin",
                tiles.consumers,
                if tiles.persistent { ".walk" } else { "" },
                if tiles.head_major { "" } else { ".qbm" },
                if k.plan.tma_store_o { ".tmao" } else { "" },
                if k.plan.q_regs { ".qregs" } else { "" },
                if k.plan.rowsum_mma { ".rowsum" } else { "" }
            );
            std::fs::create_dir_all(&dir).expect("cubin dir");
            std::fs::write(std::path::Path::new(&dir).join(name), &k.cubin).expect("write cubin");
        }
        if spills == 0 {
            built.push((d, causal, tiles, k));
        }
    }
    if !launch::driver_available() {
        println!("tune90: no CUDA driver, built only");
        return;
    }
    launch::ensure_context(0).expect("context");
    // Per length and head dim: one input set, then every (variant, entry)
    // timed in interleaved rounds, the median printed: the GPU runs faster
    // for the first ~50 ms after an idle pause (the A/B of 2026-12-04: +10%),
    // so timing each variant once after its own setup favours whichever
    // comes first.
    // ATTNFORGE_TUNE90_ROUNDS: more rounds where the spread is wide (3 by default).
    let rounds: usize = std::env::var("ATTNFORGE_TUNE90_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for &s in &lens {
        for &d in &dims {
            let h = 2048 / d;
            let b = 16384 / s;
            let (_buffers, fa) = fwd_problem(b, h, s, d, rng);
            // Both entries of every variant: one tile per block, and the walk
            // on the resident blocks; `rule` marks the launcher's choice.
            let mut runs = Vec::new();
            for (_, causal, tiles, k) in built.iter().filter(|x| x.0 == d) {
                let lk = launch::load(k).expect("load");
                let walks = lk.walks(&fa).expect("checked call");
                // One tile per block (as clusters of two where the plan and
                // the problem allow, and then also every block alone), and
                // the walk.
                let pairs = lk.pairs(&fa).expect("checked call");
                let mut grids = vec![(if pairs { "tiles (pairs)" } else { "tiles" }, launch::ONE_TILE)];
                if pairs {
                    grids.push(("tiles alone", launch::ONE_TILE));
                }
                if lk.has_walk() {
                    grids.push(("walk", lk.resident_blocks()));
                }
                for (grid, cap) in grids {
                    let rule = if walks {
                        grid == "walk"
                    } else {
                        grid.starts_with("tiles") && grid != "tiles alone"
                    };
                    runs.push((*causal, *tiles, k, lk.clone(), grid, cap, rule));
                }
            }
            let mut figures = vec![Vec::new(); runs.len()];
            for _ in 0..rounds {
                for (i, (causal, _, _, lk, grid, cap, _)) in runs.iter().enumerate() {
                    lk.set_persistent_grid(*cap);
                    lk.set_clusters(*grid != "tiles alone");
                    // SAFETY: buffers sized for the problem.
                    let ms = time_ms(
                        || unsafe { launch::launch_fwd(lk, &fa, std::ptr::null_mut()).expect("launch") },
                        5.0,
                        25.0,
                    );
                    lk.set_persistent_grid(0);
                    lk.set_clusters(true);
                    figures[i].push(4.0 * (b * h * s * s * d) as f64 * if *causal { 0.5 } else { 1.0 } / ms / 1e9);
                }
            }
            for ((causal, tiles, k, lk, grid, _, rule), f) in runs.iter().zip(&figures) {
                // The options that set this row apart from a plain variant of
                // the same tiles (the flips above), and the per-call variant
                // whose tiles these are.
                let p = &k.plan;
                let mut opts: Vec<&str> = [
                    (p.tma_store_o, "tma-o"),
                    (p.rowsum_mma, "rowsum"),
                    (p.tail_first, "tail-first"),
                    (p.cluster_m > 1, "pairs"),
                    (p.min_blocks_per_sm == 2, "2/SM"),
                    (p.min_blocks_per_sm == 3, "3/SM"),
                    (p.q_regs, "q-regs"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                // The per-call variant with these tiles, TMA stores of O aside.
                let plain = |t: Sm90aFwdTiles| Sm90aFwdTiles {
                    tma_store_o: false,
                    ..t
                };
                for (variant, name) in [
                    (attnforge::plan::short_keys_tiles(&p.spec), "=short-keys"),
                    (attnforge::plan::mid_keys_tiles(&p.spec), "=mid-keys"),
                ] {
                    if variant.is_some_and(|t| plain(t) == plain(*tiles)) {
                        opts.push(name);
                    }
                }
                println!(
                    "tune90 d={d:<3} s={s:<5} causal={causal:<5} consumers={} bn={:<3} stages={} pingpong={:<5} head_major={:<5} opts={:<12} {:6.1} TFLOP/s grid={grid}{}{} (rounds {})",
                    p.block_m / 64,
                    p.block_n,
                    p.stages,
                    p.pingpong,
                    tiles.head_major,
                    if opts.is_empty() { "-".to_string() } else { opts.join(",") },
                    median(f),
                    if *rule { " rule" } else { "" },
                    if lk.has_walk() { "" } else { " (module without the walk entry)" },
                    f.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ")
                );
            }
        }
    }
}

/// The traced blocks of a tracing build's grid record (`attnforge_trace_grid`:
/// SM, start, end per block; blocks that did not record are skipped).
fn traced_blocks(gr: &[u64]) -> Vec<(u64, u64, u64)> {
    gr.chunks(3)
        .filter(|c| c[1] != 0 && c[2] != 0)
        .map(|c| (c[0], c[1], c[2]))
        .collect()
}

/// A traced launch's grid (`attnforge_trace_grid`: SM, start, end per
/// block): the launch's span and, per SM, the share of it spent in blocks,
/// between blocks (the next block's start after one's end) and after its
/// last block.
fn grid_summary(gr: &[u64]) -> String {
    let blocks = traced_blocks(gr);
    let t0 = blocks.iter().map(|x| x.1).min().unwrap_or(0);
    let t1 = blocks.iter().map(|x| x.2).max().unwrap_or(0);
    let mut per_sm: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for &(sm, a, e) in &blocks {
        per_sm.entry(sm).or_default().push((a, e));
    }
    let (mut gaps, mut tails, mut busy) = (0u64, 0u64, 0u64);
    for v in per_sm.values_mut() {
        v.sort();
        for w in v.windows(2) {
            gaps += w[1].0.saturating_sub(w[0].1);
        }
        tails += t1 - v.last().map(|x| x.1).unwrap_or(t1);
        gaps += v.first().map(|x| x.0 - t0).unwrap_or(0);
        busy += v.iter().map(|x| x.1 - x.0).sum::<u64>();
    }
    let span = (t1 - t0).max(1) as f64 * per_sm.len().max(1) as f64;
    format!(
        "traced launch {:.1} us over {} blocks on {} SMs; per SM: blocks busy {:.1}%, between blocks {:.1}%, idle at the end {:.1}%",
        (t1 - t0) as f64 / 1e3,
        blocks.len(),
        per_sm.len(),
        100.0 * busy as f64 / span,
        100.0 * gaps as f64 / span,
        100.0 * tails as f64 / span
    )
}

/// Cycles per event kind over a role's stamps (an interval counts toward
/// the event that ends it), and how often `per` occurred.
fn trace_categories(stamps: &[(u32, u32, u64)], kinds: usize, per: u32) -> (Vec<u64>, usize) {
    let mut sum = vec![0u64; kinds];
    let mut count = 0;
    for w in stamps.windows(2) {
        let (e, dt) = (w[1].0 as usize, w[1].2.wrapping_sub(w[0].2) & ((1 << 40) - 1));
        if e < kinds {
            sum[e] += dt;
        }
        if w[1].0 == per {
            count += 1;
        }
    }
    (sum, count)
}

/// Per (block, role) of the first `blocks` traced blocks (`roles` stamping
/// roles each, of which the first `active` stamped): the cycles per event kind
/// and how often `per` occurred (`trace_categories`), where the role stamped
/// twice or more.
fn role_categories(
    ev: &[u64],
    (blocks, roles, active, events): (usize, usize, usize, usize),
    kinds: usize,
    per: u32,
) -> Vec<(usize, usize, Vec<u64>, usize)> {
    let mut out = Vec::new();
    for blk in 0..blocks {
        for role in 0..active.min(roles) {
            let base = (blk * roles + role) * events;
            let stamps = trace_stamps(&ev[base..base + events]);
            if stamps.len() >= 2 {
                let (sum, count) = trace_categories(&stamps, kinds, per);
                out.push((blk, role, sum, count));
            }
        }
    }
    out
}

/// "name p%" for each category with time, as shares of the total.
fn shares(sum: &[u64], names: &[&str]) -> String {
    let total = sum.iter().sum::<u64>().max(1) as f64;
    (1..sum.len().min(names.len()))
        .filter(|&e| sum[e] > 0)
        .map(|e| format!("{} {:.1}%", names[e], 100.0 * sum[e] as f64 / total))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first `n` stamps as "event.index:cycles since the first".
fn raw_events(stamps: &[(u32, u32, u64)], n: usize) -> String {
    let Some(first) = stamps.first() else {
        return String::new();
    };
    stamps
        .iter()
        .take(n)
        .map(|(e, i, t)| {
            let index = if *i > 0 { format!(".{i}") } else { String::new() };
            format!("{e}{index}:{}", t.wrapping_sub(first.2) & ((1 << 40) - 1))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The planner's plan compiled with `ATTNFORGE_TRACE` defined (the
/// templates' stamps; see templates/common/trace.cuh), outside the cache.
fn tracing_build(plan: attnforge::KernelPlan) -> attnforge::CompiledKernel {
    let mut rendered = attnforge::render::render(&plan).expect("render");
    rendered.source = format!("#define ATTNFORGE_TRACE 1\n{}", rendered.source);
    let nvrtc = attnforge::compile::Nvrtc::get().expect("nvrtc");
    let (cubin, meta) = attnforge::jit::compile_plan(&plan, &rendered, nvrtc).expect("compile");
    println!(
        "tracing build of {}: block_m={} block_n={} regs={} spills={} B",
        plan.spec,
        plan.block_m,
        plan.block_n,
        meta.registers,
        meta.spill_stores + meta.spill_loads
    );
    let key = attnforge::jit::cache_key(
        &plan,
        &rendered,
        &nvrtc.version_string(),
        &attnforge::jit::compile_options(&plan),
    );
    attnforge::CompiledKernel {
        spec: plan.spec,
        variant: attnforge::plan::Variant::Main,
        plan,
        key,
        cubin,
        meta,
        origin: attnforge::Origin::Compiled,
    }
}

/// Zero a tracing build's buffers, run `launch` once, and read them back:
/// (role stamps, grid).
fn traced_run(lk: &launch::LoadedKernel, launch: impl FnOnce()) -> (Vec<u64>, Vec<u64>) {
    let (tr, tr_bytes) = lk.global("attnforge_trace").expect("trace buffer");
    let (grid, grid_bytes) = lk.global("attnforge_trace_grid").expect("grid buffer");
    let mut ev = vec![0u64; tr_bytes / 8];
    let mut gr = vec![0u64; grid_bytes / 8];
    // SAFETY: the module's own globals, sized by the driver.
    unsafe {
        result::memset_d8_sync(tr, 0, tr_bytes).expect("memset");
        result::memset_d8_sync(grid, 0, grid_bytes).expect("memset");
    }
    launch();
    // SAFETY: as above, after the launch completed.
    unsafe {
        result::ctx::synchronize().expect("sync");
        result::memcpy_dtoh_sync(&mut ev, tr).expect("dtoh");
        result::memcpy_dtoh_sync(&mut gr, grid).expect("dtoh");
    }
    (ev, gr)
}

/// A tracing build's stamps of one role, up to the first empty slot:
/// (event, index, SM clock bits 0..39).
fn trace_stamps(slots: &[u64]) -> Vec<(u32, u32, u64)> {
    slots
        .iter()
        .take_while(|&&x| x != 0)
        .map(|&x| (((x >> 40) & 0xff) as u32, (x >> 48) as u32, x & ((1 << 40) - 1)))
        .collect()
}

/// Where the sm90a forward's time goes (`--trace90`): a tracing build of the
/// plan a call of each length takes (its short- or mid-keys variant
/// included; before session 44 the main plan at every length) (the template's ATTNFORGE_TRACE stamps: SM clock per event
/// of the producer and of each consumer warpgroup in the first blocks, and
/// every block's SM, start and end), launched once after a warm-up on each
/// entry, summed per tile into waits and work.
fn trace90(rng: &mut rand::rngs::StdRng) {
    const ROLES: usize = 4;
    const EVENTS: usize = 2048;
    let names = [
        "",
        "tile",
        "wait Q",
        "wait K (+rescale, pack)",
        "wait turn",
        "S (issue, wait)",
        "softmax",
        "wait P V",
        "epilogue",
        "wait V",
    ];
    let mut built = Vec::new();
    // ATTNFORGE_TRACE90_S: a comma list of the seqlens to trace (all six
    // problems by default, and the causal ones at 512 only when it is set).
    let only: Option<Vec<usize>> = std::env::var("ATTNFORGE_TRACE90_S")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.split(',')
                .map(|x| x.trim().parse().expect("ATTNFORGE_TRACE90_S: a comma list of seqlens"))
                .collect()
        });
    let causal_short = if only.is_some() {
        vec![(64usize, true, 512usize), (128, true, 512), (256, true, 512)]
    } else {
        vec![]
    };
    for (d, causal, s) in [
        (128usize, false, 512usize),
        (128, false, 2048),
        (128, false, 8192),
        (64, false, 512),
        (256, false, 512),
        (256, false, 2048),
    ]
    .into_iter()
    .chain(causal_short)
    .filter(|(_, _, s)| only.as_ref().is_none_or(|o| o.contains(s)))
    {
        let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
        let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, Arch::Sm90a);
        // The tiles a call of this length takes (the short- or mid-keys
        // variant where the spec has one), as the dispatcher picks them.
        let variant = attnforge::plan::Variant::for_keys(&spec, s as u32);
        let plan = attnforge::plan::plan_variant(&spec, variant)
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
            .unwrap_or_else(|| panic!("{spec}: Variant::for_keys({s}) took {variant:?}, which the spec does not have"));
        built.push((d, causal, s, tracing_build(plan)));
    }
    if !launch::driver_available() {
        println!("trace90: no CUDA driver, built only");
        return;
    }
    launch::ensure_context(0).expect("context");
    for (d, causal, s, k) in &built {
        let (d, s) = (*d, *s);
        let (h, b) = (2048 / d, 16384 / s);
        let (_buffers, fa) = fwd_problem(b, h, s, d, rng);
        let lk = launch::load(k).expect("load");
        for (entry, cap) in [("one tile", launch::ONE_TILE), ("walk", lk.resident_blocks())] {
            lk.set_persistent_grid(cap);
            // SAFETY: buffers sized for the problem; the trace buffers are the module's globals.
            let ms = time_ms(
                || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") },
                5.0,
                20.0,
            );
            // SAFETY: as above.
            let (ev, gr) = traced_run(&lk, || unsafe {
                launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch")
            });
            let flops = 4.0 * (b * h * s * s * d) as f64 * if *causal { 0.5 } else { 1.0 };
            println!(
                "trace90 d={d:<3} s={s:<5} causal={causal:<5} {entry:<8}: {:.1} TFLOP/s timed, {} (block_m {} block_n {})",
                flops / ms / 1e9,
                grid_summary(&gr),
                k.plan.block_m,
                k.plan.block_n
            );
            // Per block and consumer warpgroup: cycles per category, summed
            // over the block's tiles (an event's time counts toward the
            // category of the event that ends it).
            for blk in 0..2usize {
                for role in 1..ROLES {
                    let base = (blk * ROLES + role) * EVENTS;
                    let stamps = trace_stamps(&ev[base..base + EVENTS]);
                    if stamps.len() < 2 {
                        continue;
                    }
                    let (sum, tiles) = trace_categories(&stamps, names.len(), 1);
                    let total: u64 = sum.iter().sum();
                    println!(
                        "trace90   block {blk} warpgroup {}: {} tiles, {:.0} cycles per tile: {}",
                        role - 1,
                        tiles + 1,
                        total as f64 / (tiles + 1) as f64,
                        shares(&sum, &names)
                    );
                }
                // The producer's first tiles: cycles from the tile start to
                // Q free and to each issue.
                let base = blk * ROLES * EVENTS;
                let stamps = trace_stamps(&ev[base..base + EVENTS]);
                println!("trace90   block {blk} producer: {}", raw_events(&stamps, 40));
            }
            // The first consumer warpgroup's raw events of block 0 (event.index:cycles).
            let stamps = trace_stamps(&ev[EVENTS..2 * EVENTS]);
            println!("trace90   block 0 warpgroup 0 events: {}", raw_events(&stamps, 80));
            lk.set_persistent_grid(0);
        }
    }
}

/// A forward problem in BHSD (b × h heads, seqlen s, head dim d) on fresh
/// random Q, K, V, with O and LSE buffers; the buffers live as long as the
/// returned vector.
/// Sequence lengths of a ragged THD problem: 16k tokens in sequences of
/// random length 128..4096.
fn ragged_lens(rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut total = 0;
    while total < 16384 {
        let l = rng.gen_range(128..=4096).min(16384 - total);
        lens.push(l);
        total += l;
    }
    lens
}

/// A ragged THD self-attention problem over `lens`, h = 2048 / d heads,
/// random inputs: the buffers and the arguments (cu_seqlens on the device).
fn ragged_problem(d: usize, lens: &[usize], rng: &mut rand::rngs::StdRng) -> (Vec<Dev>, FwdArgs) {
    let h = 2048 / d;
    let total: usize = lens.iter().sum();
    let mut cu = vec![0i32];
    for l in lens {
        cu.push(cu.last().unwrap() + *l as i32);
    }
    let max = *lens.iter().max().unwrap();
    let n = total * h * d;
    let bufs = vec![
        Dev::random(n, rng),
        Dev::random(n, rng),
        Dev::random(n, rng),
        Dev::zeroed(n * 2),
        Dev::zeroed(h * total * 4),
        Dev::zeroed(cu.len() * 4),
    ];
    // SAFETY: bufs[5] holds cu.len() int32.
    unsafe { result::memcpy_htod_sync(bufs[5].0, &cu).expect("htod") };
    let t = |p| TensorArg::thd(p, h as i64, d as i64);
    let fa = FwdArgs {
        q: t(bufs[0].0),
        k: t(bufs[1].0),
        v: t(bufs[2].0),
        o: t(bufs[3].0),
        lse: Some(bufs[4].0),
        problem: FwdProblem {
            batch: lens.len() as u32,
            heads_q: h as u32,
            heads_kv: h as u32,
            seqlen_q: max as u32,
            seqlen_k: max as u32,
            cu_seqlens_q: Some(bufs[5].0),
            cu_seqlens_k: Some(bufs[5].0),
            total_q: total as u32,
            total_k: total as u32,
            window: (-1, -1),
            ..Default::default()
        },
    };
    (bufs, fa)
}

/// Forward FLOPs of a ragged problem (causal: half of each sequence's square).
fn ragged_flops(lens: &[usize], h: usize, d: usize, causal: bool) -> f64 {
    let pairs: f64 = lens
        .iter()
        .map(|&l| (l * l) as f64 * if causal { 0.5 } else { 1.0 })
        .sum();
    4.0 * pairs * (h * d) as f64
}

fn fwd_problem(b: usize, h: usize, s: usize, d: usize, rng: &mut rand::rngs::StdRng) -> (Vec<Dev>, FwdArgs) {
    let n = b * h * s * d;
    let bufs = vec![
        Dev::random(n, rng),
        Dev::random(n, rng),
        Dev::random(n, rng),
        Dev::zeroed(n * 2),
        Dev::zeroed(b * h * s * 4),
    ];
    let fa = bhsd_args([bufs[0].0, bufs[1].0, bufs[2].0, bufs[3].0], bufs[4].0, b, h, s, d);
    (bufs, fa)
}

/// A backward problem in BHSD (b × h heads, seqlen s, head dim d) on fresh
/// random Q, K, V and dO, with O and LSE from the planner's forward of `spec`
/// and the workspace that `plan` states (trace80b and the A/B's backward cells).
struct BwdProblem {
    _buffers: Vec<Dev>,
    ws: Dev,
    ws_bytes: u64,
    args: launch_bwd::BwdArgs,
}

fn bwd_problem(
    spec: &AttnSpec,
    plan: &attnforge::KernelPlan,
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    rng: &mut rand::rngs::StdRng,
) -> BwdProblem {
    let n = b * h * s * d;
    let (mut buffers, fa) = fwd_problem(b, h, s, d, rng);
    let d_o = Dev::random(n, rng);
    let [dq, dk, dv, dsum] = [
        Dev::zeroed(n * 2),
        Dev::zeroed(n * 2),
        Dev::zeroed(n * 2),
        Dev::zeroed(b * h * s * 4),
    ];
    let fl = launch::load(&attnforge::get_or_build(spec).expect("forward")).expect("load forward");
    // SAFETY: buffers sized for the problem.
    unsafe { launch::launch_fwd(&fl, &fa, std::ptr::null_mut()).expect("forward") };
    let ws_bytes = launch_bwd::bwd_workspace_bytes(plan, &fa.problem);
    let like = |ptr: u64| TensorArg { ptr, ..fa.q };
    let args = launch_bwd::BwdArgs {
        q: fa.q,
        k: fa.k,
        v: fa.v,
        o: fa.o,
        d_o: like(d_o.0),
        lse: fa.lse.expect("the forward's LSE"),
        dsum: dsum.0,
        dq: like(dq.0),
        dk: like(dk.0),
        dv: like(dv.0),
        problem: fa.problem.clone(),
    };
    buffers.extend([d_o, dq, dk, dv, dsum]);
    BwdProblem {
        _buffers: buffers,
        ws: Dev::zeroed(ws_bytes.max(16) as usize),
        ws_bytes,
        args,
    }
}

/// Where the sm80-path backward's time goes (`--trace80b`): a tracing
/// build of `bwd_sm80.cu` (lane 0 of every warp of the main kernel stamps
/// each query tile's phases), launched once after a warm-up, summed per
/// warp of the first two blocks. Same problems as the bench's d64/d128/d256
/// rows at 8k, no mask; the forward (the planner's) fills O and LSE first.
fn trace80b(rng: &mut rand::rngs::StdRng) {
    const ROLES: usize = 16;
    const EVENTS: usize = 2048;
    let names = [
        "",
        "next query tile (cp.async wait, barrier)",
        "S, dP, P and dS to shared memory",
        "barrier after S",
        "dV, dK",
        "dQ (reductions)",
        "barrier at the end",
        "epilogue",
    ];
    let s = 8192usize;
    let mut built = Vec::new();
    for d in [64usize, 128, 256] {
        let spec = AttnSpec::fwd(DType::Bf16, d as u16, Mask::None, Layout::Dense, Arch::Sm90a);
        let bspec = AttnSpec {
            direction: attnforge::Direction::Bwd,
            ..spec
        };
        let Some(plan) = attnforge::plan::plan_bwd::plan_bwd_sm80(&bspec) else {
            println!("trace80b {bspec}: no sm80-path plan");
            continue;
        };
        built.push((d, spec, tracing_build(plan)));
    }
    if !launch::driver_available() {
        println!("trace80b: no CUDA driver, built only");
        return;
    }
    launch::ensure_context(0).expect("context");
    for (d, spec, bk) in &built {
        let d = *d;
        let (h, b) = (2048 / d, 16384 / s);
        let bp = bwd_problem(spec, &bk.plan, b, h, s, d, rng);
        let bl = launch::load(bk).expect("load");
        let (ba, ws, ws_bytes) = (&bp.args, &bp.ws, bp.ws_bytes);
        // SAFETY: buffers sized for the problem; the forward filled O and LSE.
        let run = || unsafe { launch_bwd::launch_bwd(&bl, ba, ws.0, ws_bytes, std::ptr::null_mut()).expect("bwd") };
        let ms = time_ms(run, 10.0, 50.0);
        let (ev, gr) = traced_run(&bl, run);
        let flops = 2.5 * 4.0 * (b * h * s * s * d) as f64;
        println!(
            "trace80b d={d:<3} s={s} b={b} h={h} block_m={} block_n={} warps={}: {:.1} TFLOP/s timed (whole backward), main kernel {}",
            bk.plan.block_m,
            bk.plan.block_n,
            bk.plan.num_warps,
            flops / ms / 1e9,
            grid_summary(&gr)
        );
        let warps = bk.plan.num_warps as usize;
        for (blk, warp, sum, tiles) in role_categories(&ev, (2, ROLES, warps, EVENTS), names.len(), 1) {
            println!(
                "trace80b   block {blk} warp {warp}: {tiles} query tiles, {:.0} cycles per tile: {}",
                sum.iter().sum::<u64>() as f64 / tiles.max(1) as f64,
                shares(&sum, &names)
            );
        }
    }
}

/// How a traced launch kept its SMs busy when several blocks share an SM: the
/// share of SM-time with 0, 1, 2, 3+ blocks resident (over the launch's span),
/// the blocks' durations (10th / 50th / 90th percentile), and the median of
/// the first blocks to start (one per slot: the first `slots` by start time)
/// against the rest.
fn grid_occupancy(gr: &[u64], slots: usize) -> String {
    let mut blocks = traced_blocks(gr);
    if blocks.is_empty() {
        return "no blocks traced".into();
    }
    let t0 = blocks.iter().map(|x| x.1).min().unwrap_or(0);
    let t1 = blocks.iter().map(|x| x.2).max().unwrap_or(0);
    let mut per_sm: std::collections::BTreeMap<u64, Vec<(u64, i64)>> = Default::default();
    for &(sm, a, e) in &blocks {
        let v = per_sm.entry(sm).or_default();
        v.push((a, 1));
        v.push((e, -1));
    }
    let mut at = [0u64; 4];
    for v in per_sm.values_mut() {
        v.sort();
        let (mut t, mut n) = (t0, 0i64);
        for &(x, dn) in v.iter() {
            at[(n.max(0) as usize).min(3)] += x - t;
            t = x;
            n += dn;
        }
        at[0] += t1 - t;
    }
    let total = at.iter().sum::<u64>().max(1) as f64;
    let pct = |v: &[u64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    let mut dur: Vec<u64> = blocks.iter().map(|x| x.2 - x.1).collect();
    dur.sort();
    blocks.sort_by_key(|x| x.1);
    let split = slots.min(blocks.len());
    let med = |v: &[(u64, u64, u64)]| {
        let mut d: Vec<u64> = v.iter().map(|x| x.2 - x.1).collect();
        d.sort();
        if d.is_empty() {
            0.0
        } else {
            d[d.len() / 2] as f64 / 1e3
        }
    };
    format!(
        "SM-time with 0/1/2/3+ blocks resident {:.1}% / {:.1}% / {:.1}% / {:.1}%; block durations p10/p50/p90 {:.1} / {:.1} / {:.1} us; first {} blocks median {:.1} us, the rest {:.1} us",
        100.0 * at[0] as f64 / total,
        100.0 * at[1] as f64 / total,
        100.0 * at[2] as f64 / total,
        100.0 * at[3] as f64 / total,
        pct(&dur, 0.1),
        pct(&dur, 0.5),
        pct(&dur, 0.9),
        split,
        med(&blocks[..split]),
        med(&blocks[split..])
    )
}

/// Where the sm80-path forward's time goes (`--trace80f`): a tracing build of
/// `fwd_sm80.cu` (lane 0 of every warp stamps each key tile's phases; every
/// block records its SM, start and end), launched once after a warm-up, at
/// d64/d128/d256 without a mask, 2k and 8k (the bench's problems, BHSD): the
/// blocks' residency per SM, and per warp of the first two blocks the
/// prologue, the epilogue and the shares of a key tile.
fn trace80f(rng: &mut rand::rngs::StdRng) {
    const ROLES: usize = 16;
    const EVENTS: usize = 2048;
    let names = [
        "",
        "",
        "prologue",
        "next tile (wait, barrier)",
        "S = QK^T",
        "V wait, barrier (one buffer)",
        "mask, softmax",
        "P V",
        "epilogue",
    ];
    let mut built = Vec::new();
    for d in [64usize, 128, 256] {
        let spec = AttnSpec::fwd(DType::Bf16, d as u16, Mask::None, Layout::Dense, Arch::Sm90a);
        match attnforge::plan::plan_sm80_path(&spec) {
            Ok(plan) => built.push((d, tracing_build(plan))),
            Err(e) => println!("trace80f {spec}: no sm80-path plan ({e})"),
        }
    }
    if !launch::driver_available() {
        println!("trace80f: no CUDA driver, built only");
        return;
    }
    launch::ensure_context(0).expect("context");
    let sms = launch::device_sm_count().unwrap_or(1).max(1) as usize;
    for (d, bk) in &built {
        let d = *d;
        let lk = launch::load(bk).expect("load");
        for s in [2048usize, 8192] {
            let (h, b) = (2048 / d, 16384 / s);
            let (_bufs, fa) = fwd_problem(b, h, s, d, rng);
            // SAFETY: the buffers are sized for the problem in `fa`.
            let run = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") };
            let ms = time_ms(run, 10.0, 50.0);
            let (ev, gr) = traced_run(&lk, run);
            let flops = 4.0 * (b * h * s * s * d) as f64;
            let slots = lk.slots() as usize;
            let per_sm = slots / sms;
            println!(
                "trace80f d={d:<3} s={s:<5} b={b} h={h} block_m={} block_n={} warps={} stages={} ({per_sm} blocks per SM): {:.1} TFLOP/s timed, {}",
                bk.plan.block_m,
                bk.plan.block_n,
                bk.plan.num_warps,
                bk.plan.stages,
                flops / ms / 1e9,
                grid_summary(&gr)
            );
            println!("trace80f   {}", grid_occupancy(&gr, slots));
            let warps = bk.plan.num_warps as usize;
            for (blk, warp, sum, tiles) in role_categories(&ev, (2, ROLES, warps, EVENTS), names.len(), 3) {
                // Key tiles: one per EV_F_TILE, plus the first, which EV_F_FIRST opens after the prologue.
                let tile_cycles: u64 = sum[3..8].iter().sum();
                println!(
                    "trace80f   block {blk} warp {warp}: prologue {} cycles, {} key tiles at {:.0} cycles ({}), epilogue {} cycles",
                    sum[2],
                    tiles + 1,
                    tile_cycles as f64 / (tiles + 1) as f64,
                    shares(&sum, &names),
                    sum[8]
                );
            }
        }
    }
}

/// The file of `spec` that `--ab` takes from `dir`: `file` where it is there;
/// else, for the sm90a forward (`{spec}.c{consumers}.bn{block_n}.st{stages}.cubin`),
/// the dir's one cubin of the same spec under another tile plan, if its plan
/// sidecar is beside it (a branch that changes the planner's tiles; the A/B
/// then launches it with that plan).
fn ab_file(dir: &str, stem: &str, file: &str) -> String {
    let prefix = format!("{stem}.c");
    if std::path::Path::new(dir).join(file).exists() || !file.starts_with(&prefix) {
        return file.to_string();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return file.to_string();
    };
    let mut other: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".cubin"))
        .filter(|n| std::path::Path::new(dir).join(format!("{n}.plan.json")).exists())
        .collect();
    other.sort();
    match other.as_slice() {
        [one] => {
            println!("ab {stem}: {dir} has {one} (another tile plan) in place of {file}");
            one.clone()
        }
        _ => file.to_string(),
    }
}

/// Same-process A/B of the planner's kernels against carried cubins
/// (`--ab DIR[,DIR...]`, session step `ab`, dirs from `scripts/ab-cubins.sh REV DIR`):
/// the sm90a forward in the variant a call of the cell takes
/// (`{spec}{variant suffix}.c{consumers}.bn{block_n}.st{stages}.cubin`: the
/// short-keys plan at 512, the mid-keys one at 2k where the spec has them; both
/// entries, the launcher's rule: the walk for short keys), the planner's
/// backward (`{spec}.cubin`: the sm80 instruction path at d256, the wgmma
/// backward at d64/d128, marked `bwd90`), and the sm80
/// path's forward and d64/d128 backward where the planner takes wgmma
/// (`{spec}.sm80path.cubin`, `attnforge compile --path sm80`), dense and (`s=thd`)
/// the bench's ragged THD problem from a fixed draw of lengths, each cubin built
/// from another tree and launched with that tree's plan (`{cubin}.plan.json`
/// beside it; this tree's plan where it is missing). Every module is timed as
/// the peers are, in interleaved rounds on the same inputs (at least five,
/// or `ATTNFORGE_AB_ROUNDS`; the modules of each in a balanced Latin square's
/// order); the median per module.
fn ab(dirs: &[&str], rng: &mut rand::rngs::StdRng) {
    launch::ensure_context(0).expect("context");
    // The planner's kernel and each dir's cubin of the same plan under `file`.
    let modules = |spec: &AttnSpec, planned: &attnforge::CompiledKernel, file: &str| {
        let mut kernels = vec![("this tree".to_string(), planned.clone())];
        let stem = format!("{spec}{}", planned.variant.suffix());
        for dir in dirs {
            let file = ab_file(dir, &stem, file);
            let file = file.as_str();
            match std::fs::read(std::path::Path::new(dir).join(file)) {
                Ok(bytes) => {
                    // The same spec's entries, the other cubin, launched with the
                    // other revision's plan where ab-cubins.sh wrote it beside the
                    // cubin (`{file}.plan.json`): its shared-memory layout may differ
                    // from this tree's (session 14: the d64 backward's lost a tile).
                    let mut k = planned.clone();
                    k.cubin = bytes;
                    let sidecar = std::path::Path::new(dir).join(format!("{file}.plan.json"));
                    if let Ok(text) = std::fs::read_to_string(&sidecar) {
                        match serde_json::from_str::<attnforge::plan::KernelPlan>(&text) {
                            Ok(p) if p.entry == k.plan.entry => k.plan = p,
                            Ok(p) => println!(
                                "ab {spec}: {} names {}, not {}",
                                sidecar.display(),
                                p.entry,
                                k.plan.entry
                            ),
                            Err(e) => println!("ab {spec}: {} unreadable ({e}); this tree's plan", sidecar.display()),
                        }
                    }
                    k.key.0[0] ^= 0x5a ^ kernels.len() as u8; // its own slot in the loader's memo
                    kernels.push((format!("{dir}/{file}"), k));
                }
                Err(e) => println!("ab {spec}: no {file} in {dir} ({e})"),
            }
        }
        // A cubin that does not load (launch::load refuses one whose
        // parameters are not this tree's) drops out of the cell.
        kernels
            .into_iter()
            .filter_map(|(name, k)| match launch::load(&k) {
                Ok(l) => Some((name, l)),
                Err(e) if name != "this tree" => {
                    println!("ab {spec}: {name} not loaded: {e}");
                    None
                }
                Err(e) => panic!("ab {spec}: this tree's kernel does not load: {e}"),
            })
            .collect::<Vec<_>>()
    };
    // Interleaved rounds, TFLOP/s per round per module. The modules of a round in a balanced Latin square's order (`williams`):
    // a kernel's clocks depend on what ran just before it, so every module
    // follows every other equally often (a cyclic order puts the same one
    // before it every round; session 32).
    // ATTNFORGE_AB_ROUNDS: more rounds than the square's (at least five) where
    // the rounds of a cell spread more than the difference sought.
    let min_rounds = match std::env::var("ATTNFORGE_AB_ROUNDS") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("ATTNFORGE_AB_ROUNDS={v}: not a number of rounds"))
            .max(5),
        Err(_) => 5,
    };
    let rounds = |n: usize, run: &mut dyn FnMut(usize), flops: f64| {
        let mut figures = vec![Vec::new(); n];
        let square = williams(n);
        for round in 0..square.len().max(min_rounds) {
            for &i in &square[round % square.len()] {
                let ms = time_ms(|| run(i), 5.0, 25.0);
                figures[i].push(flops / ms / 1e9);
            }
        }
        figures
    };
    let report = |what: &str, name: &str, f: &[f64], entry: &str| {
        println!(
            "ab {what} {:7.1} TFLOP/s median (rounds {}){entry} {name}",
            median(f),
            f.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" "),
        );
    };
    // The planner's sm90a forward (`{spec}.c{consumers}.bn{block_n}.st{stages}.cubin`)
    // and, marked `fwd80`, the sm80 instruction path's forward where the
    // planner takes wgmma (`attnforge compile --path sm80`, `{spec}.sm80path.cubin`).
    // The ragged cells' lengths: a fixed draw, the same in every run.
    let ragged_lens_ab = ragged_lens(&mut rand::rngs::StdRng::seed_from_u64(11));
    for (sm80, d, causal, s) in [
        (false, 64usize, false, 512usize),
        (false, 64, true, 512),
        (false, 64, true, 2048),
        (false, 64, false, 2048),
        (false, 64, false, 8192),
        (false, 128, false, 512),
        (false, 128, true, 512),
        (false, 256, false, 512),
        (false, 128, false, 2048),
        (false, 256, false, 2048),
        (false, 128, false, 8192),
        (false, 128, false, 16384),
        (false, 256, true, 2048),
        (false, 128, true, 2048),
        (false, 128, true, 8192),
        (false, 128, true, 16384),
        (false, 256, true, 16384),
        (true, 64, false, 2048),
        (true, 128, false, 2048),
        (true, 128, true, 2048),
        (true, 256, false, 2048),
        (true, 64, false, 8192),
        (true, 64, true, 8192),
        (true, 128, false, 8192),
        (true, 128, true, 8192),
        (true, 256, false, 8192),
        // s = 0: the bench's ragged THD problem (causal bottom-right).
        (false, 128, false, 0),
        (false, 128, true, 0),
        (false, 256, false, 0),
        (false, 256, true, 0),
        (true, 256, false, 0),
    ] {
        let ragged = s == 0;
        let (mask, layout) = match (causal, ragged) {
            (false, false) => (Mask::None, Layout::Dense),
            (true, false) => (Mask::CausalTopLeft, Layout::Dense),
            (false, true) => (Mask::None, Layout::Thd),
            (true, true) => (Mask::CausalBottomRight, Layout::Thd),
        };
        let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, layout, Arch::Sm90a);
        let (planned, file, what) = if sm80 {
            let plan = attnforge::plan::plan_sm80_path(&spec).expect("sm80-path plan");
            let k = attnforge::jit::build_plan(plan).expect("build");
            (k, format!("{spec}.sm80path.cubin"), "fwd80 ")
        } else {
            // The variant a call of this problem takes (the launcher's rule:
            // dense seqlen_k, ragged the longest sequence).
            let keys = if ragged {
                ragged_lens_ab.iter().copied().max().unwrap_or(0)
            } else {
                s
            };
            let variant = attnforge::plan::Variant::for_keys(&spec, keys as u32);
            let k = (*attnforge::Jit::global()
                .get_or_build_variant(&spec, variant)
                .expect("build"))
            .clone();
            let file = format!(
                "{spec}{}.c{}.bn{}.st{}.cubin",
                variant.suffix(),
                k.plan.block_m / 64,
                k.plan.block_n,
                k.plan.stages
            );
            (k, file, "")
        };
        let runs = modules(&spec, &planned, &file);
        if runs.len() < 2 {
            continue;
        }
        let variant = variant_label(planned.variant);
        let h = 2048 / d;
        let (_buffers, fa, flops) = if ragged {
            let (bufs, fa) = ragged_problem(d, &ragged_lens_ab, rng);
            (bufs, fa, ragged_flops(&ragged_lens_ab, h, d, causal))
        } else {
            let b = 16384 / s;
            let (bufs, fa) = fwd_problem(b, h, s, d, rng);
            (
                bufs,
                fa,
                4.0 * (b * h * s * s * d) as f64 * if causal { 0.5 } else { 1.0 },
            )
        };
        let seq = if ragged { "thd".to_string() } else { s.to_string() };
        // SAFETY: buffers sized for the problem.
        let mut run = |i: usize| unsafe { launch::launch_fwd(&runs[i].1, &fa, std::ptr::null_mut()).expect("launch") };
        let figures = rounds(runs.len(), &mut run, flops);
        for ((name, lk), f) in runs.iter().zip(&figures) {
            report(
                &format!("{what}d={d:<3} s={seq:<5} causal={causal:<5}"),
                name,
                f,
                &format!("{}{variant}", entry_of(lk, &fa)),
            );
        }
    }
    // The backward on the sm80 instruction path (d256: the planner's choice
    // on sm90a, `{spec}.cubin`; d64 and d128, where the planner takes wgmma:
    // `{spec}.sm80path.cubin`) and, marked `bwd90`, the planner's wgmma
    // backward (`{spec}.cubin`); the whole backward (_pre, main, _dq_convert)
    // timed.
    for (wgmma, d, causal, s) in [
        (false, 256usize, false, 2048usize),
        (false, 256, false, 8192),
        (false, 256, true, 8192),
        (false, 64, false, 8192),
        (false, 64, true, 8192),
        (false, 128, false, 8192),
        (false, 128, true, 8192),
        (true, 64, false, 8192),
        (true, 128, false, 8192),
        (true, 128, true, 8192),
    ] {
        let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
        let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, Arch::Sm90a);
        let bspec = AttnSpec {
            direction: attnforge::Direction::Bwd,
            ..spec
        };
        let plan = attnforge::plan::plan_sm80_path(&bspec).expect("sm80-path plan");
        let planner = attnforge::plan::plan(&bspec).expect("plan").template;
        if wgmma && planner == plan.template {
            continue; // the planner's backward is the sm80 path's: timed above
        }
        let (planned, file) = if wgmma || plan.template == planner {
            (
                (*attnforge::get_or_build(&bspec).expect("build")).clone(),
                format!("{bspec}.cubin"),
            )
        } else {
            (
                attnforge::jit::build_plan(plan).expect("build"),
                format!("{bspec}.sm80path.cubin"),
            )
        };
        let runs = modules(&bspec, &planned, &file);
        if runs.len() < 2 {
            continue;
        }
        let (h, b) = (2048 / d, 16384 / s);
        let bp = bwd_problem(&spec, &planned.plan, b, h, s, d, rng);
        let (ba, ws, ws_bytes) = (&bp.args, &bp.ws, bp.ws_bytes);
        let flops = 10.0 * (b * h * s * s * d) as f64 * if causal { 0.5 } else { 1.0 };
        // SAFETY: buffers sized for the problem; the forward filled O and LSE.
        let mut run = |i: usize| unsafe {
            launch_bwd::launch_bwd(&runs[i].1, ba, ws.0, ws_bytes, std::ptr::null_mut()).expect("bwd")
        };
        let figures = rounds(runs.len(), &mut run, flops);
        for ((name, _), f) in runs.iter().zip(&figures) {
            let what = if wgmma { "bwd90" } else { "bwd  " };
            report(&format!("{what} d={d:<3} s={s:<5} causal={causal:<5}"), name, f, "");
        }
    }
}

/// `--one SPEC [--path sm80] [--seqlen S]`: one kernel (the planner's for a
/// call of this length, its short- or mid-keys variant included, or the
/// sm80 instruction path's) on the standard problem (batch × seqlen = 16k
/// tokens, hidden 2048, BHSD; dense specs, no window), launched 3 times untimed and
/// then timed: a fixed launch sequence for profilers (`scripts/ncu-stalls.sh`:
/// skip 3 launches of the main kernel).
fn one(spec: &AttnSpec, sm80: bool, s: usize, rng: &mut rand::rngs::StdRng) {
    launch::ensure_context(0).expect("context");
    if spec.layout != Layout::Dense || matches!(spec.mask, Mask::SlidingWindow) {
        eprintln!("--one: dense specs without a window only ({spec})");
        std::process::exit(2);
    }
    let d = spec.head_dim_qk as usize;
    let (h, b) = (2048 / d, (16384 / s).max(1));
    let kernel = if sm80 {
        let plan = attnforge::plan::plan_sm80_path(spec).expect("sm80-path plan");
        attnforge::jit::build_plan(plan).expect("build")
    } else {
        // The kernel a call of this length takes: the short- or mid-keys
        // variant where the spec has one (as the dispatcher picks it).
        let variant = attnforge::plan::Variant::for_keys(spec, s as u32);
        (*attnforge::Jit::global()
            .get_or_build_variant(spec, variant)
            .expect("build"))
        .clone()
    };
    let lk = launch::load(&kernel).expect("load");
    let causal = !matches!(spec.mask, Mask::None);
    let fwd_flops = 4.0 * (b * h * s * s * d) as f64 * if causal { 0.5 } else { 1.0 };
    let (ms, flops) = if spec.direction == attnforge::Direction::Bwd {
        let fspec = AttnSpec {
            direction: attnforge::Direction::Fwd,
            ..*spec
        };
        let bp = bwd_problem(&fspec, &kernel.plan, b, h, s, d, rng);
        // SAFETY: buffers sized for the problem; the forward filled O and LSE.
        let run = || unsafe {
            launch_bwd::launch_bwd(&lk, &bp.args, bp.ws.0, bp.ws_bytes, std::ptr::null_mut()).expect("bwd")
        };
        for _ in 0..3 {
            run();
        }
        (time_ms(run, 5.0, 25.0), 2.5 * fwd_flops)
    } else {
        let (_buffers, fa) = fwd_problem(b, h, s, d, rng);
        // SAFETY: buffers sized for the problem.
        let run = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("fwd") };
        for _ in 0..3 {
            run();
        }
        (time_ms(run, 5.0, 25.0), fwd_flops)
    };
    println!(
        "one {spec}{} b={b} h={h} s={s}: {:.1} TFLOP/s ({}, block_m {} block_n {} stages {})",
        if sm80 { " (sm80 path)" } else { "" },
        flops / ms / 1e9,
        kernel.plan.template.file(),
        kernel.plan.block_m,
        kernel.plan.block_n,
        kernel.plan.stages
    );
}

/// The causal block order in phases (`--phases`, session step `phases`):
/// the planner's forward (one tile per block) and backward, and the sm80
/// path's backward at d64/d128, under a causal mask at 2k, 8k and 16k, with
/// the blocks in P = 1, 2, 3, 4, 6 phases (`LoadedKernel::set_tile_phases`),
/// three interleaved rounds each; `<- rule` marks the launcher's choice
/// (`plan::causal_tile_phases`).
fn phases(rng: &mut rand::rngs::StdRng) {
    launch::ensure_context(0).expect("context");
    let cc = launch::current_compute_capability().expect("cc");
    let arch = Arch::from_compute_capability(cc.0, cc.1).expect("supported GPU");
    const PS: [u32; 5] = [1, 2, 3, 4, 6];
    // Median TFLOP/s of each P over three rounds, each starting at the next P.
    let sweep = |run: &mut dyn FnMut(), lk: &launch::LoadedKernel, flops: f64| -> Vec<f64> {
        let mut figures = vec![Vec::new(); PS.len()];
        for round in 0..3 {
            for i in (0..PS.len()).map(|j| (j + round) % PS.len()) {
                lk.set_tile_phases(PS[i]);
                let ms = time_ms(&mut *run, 5.0, 25.0);
                figures[i].push(flops / ms / 1e9);
            }
        }
        lk.set_tile_phases(0);
        figures.iter().map(|f| median(f)).collect()
    };
    let print = |what: &str, figures: &[f64], rule: u32| {
        let base = figures[0];
        for (p, f) in PS.iter().zip(figures) {
            println!(
                "phases {what} P={p} {f:7.1} TFLOP/s {:+5.1}%{}",
                (f / base - 1.0) * 100.0,
                if *p == rule { " <- rule" } else { "" }
            );
        }
    };
    for d in [64usize, 128, 256] {
        let h = 2048 / d;
        for s in [2048usize, 8192, 16384] {
            let b = 16384 / s;
            let fwd_flops = 4.0 * (b * h) as f64 * (s * s) as f64 * d as f64 / 2.0;
            let spec = AttnSpec::fwd(DType::Bf16, d as u16, Mask::CausalTopLeft, Layout::Dense, arch);
            let k = attnforge::get_or_build(&spec).expect("forward");
            let lk = launch::load(&k).expect("load");
            lk.set_persistent_grid(launch::ONE_TILE);
            let (_bufs, fa) = fwd_problem(b, h, s, d, rng);
            let tiles = s.div_ceil(k.plan.block_m as usize) as u32;
            let rule = attnforge::plan::causal_tile_phases(tiles, lk.slots());
            // SAFETY: buffers sized for the problem.
            let mut run = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") };
            let figures = sweep(&mut run, &lk, fwd_flops);
            lk.set_persistent_grid(0);
            print(
                &format!("fwd {spec} s{s} ({tiles} tiles, {} slots)", lk.slots()),
                &figures,
                rule,
            );
            // The sm80-path forward with its head-major option (the phases'
            // only sm80-path forward user), and in the default
            // query-block-major order, which ignores them.
            let sm80 = attnforge::plan::default_fwd_tiles(&spec);
            for head_major in [true, false] {
                let plan = attnforge::plan::plan_fwd_sm80_with(&spec, attnforge::plan::FwdTiles { head_major, ..sm80 });
                let k = attnforge::jit::build_plan(plan).expect("sm80-path forward");
                let lk = launch::load(&k).expect("load");
                let tiles = s.div_ceil(k.plan.block_m as usize) as u32;
                let rule = attnforge::plan::causal_tile_phases(tiles, lk.slots());
                // SAFETY: buffers sized for the problem.
                let mut run = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") };
                let figures = sweep(&mut run, &lk, fwd_flops);
                let order = if head_major {
                    "head-major"
                } else {
                    "query-block-major (ignores P)"
                };
                print(
                    &format!(
                        "fwd {spec} sm80 path {order} s{s} ({tiles} tiles, {} slots)",
                        lk.slots()
                    ),
                    &figures,
                    rule,
                );
            }

            let bspec = AttnSpec {
                direction: attnforge::Direction::Bwd,
                ..spec
            };
            let mut plans = vec![("planner", attnforge::plan(&bspec).expect("plan"))];
            if d <= 128 {
                if let Some(p) = attnforge::plan::plan_bwd::plan_bwd_sm80(&bspec) {
                    if p.template != plans[0].1.template {
                        plans.push(("sm80 path", p));
                    }
                }
            }
            for (what, plan) in plans {
                let bk = attnforge::jit::build_plan(plan.clone()).expect("backward");
                let bl = launch::load(&bk).expect("load backward");
                let p = bwd_problem(&spec, &plan, b, h, s, d, rng);
                let tiles = s.div_ceil(plan.bwd.as_ref().expect("bwd plan").block_n as usize) as u32;
                let rule = attnforge::plan::causal_tile_phases(tiles, bl.slots());
                // SAFETY: buffers and workspace sized for the problem.
                let mut run = || unsafe {
                    launch_bwd::launch_bwd(&bl, &p.args, p.ws.0, p.ws_bytes, std::ptr::null_mut()).expect("launch")
                };
                let figures = sweep(&mut run, &bl, 2.5 * fwd_flops);
                print(
                    &format!("bwd {bspec} {what} s{s} ({tiles} tiles, {} slots)", bl.slots()),
                    &figures,
                    rule,
                );
            }
        }
    }
}

/// The lengths that the default sweep's ragged cells draw (`ragged_lens` on
/// the seed-7 generator after the dense cells: the same in every run, see
/// `ragged_lens` in docs/benchmarks/*-bench.json), per head dim.
fn bench_ragged_lens(d: usize) -> Vec<usize> {
    if d == 128 {
        vec![3730, 2022, 598, 3689, 3669, 129, 2199, 348]
    } else {
        vec![2864, 1856, 734, 3733, 1257, 2479, 575, 576, 444, 1866]
    }
}

/// Short sequences for `--ragged-order`: lengths drawn from 64..=1024 by the
/// seeded generator until they hold 16384 tokens (the last one cut to fit).
fn short_ragged_lens(seed: u64) -> Vec<usize> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut lens, mut total) = (Vec::new(), 0);
    while total < 16384 {
        let l = r.gen_range(64..=1024usize).min(16384 - total);
        lens.push(l);
        total += l;
    }
    lens
}

/// Ragged batches longest keys first (`--ragged-order`, session step
/// `ragged`): the planner's THD forward at d128 and d256, without a mask and
/// causal (bottom-right), on the bench's ragged problem with four draws of
/// lengths (the `--ab` cells' seed-11 draw, the default sweep's and, since
/// sessions 46 and 48, two of short sequences of 64..=1024 tokens), the
/// one-tile entry with the sequences in batch order (off) and longest keys
/// first (on, `LoadedKernel::set_ragged_order`), and since session 46 the
/// walk entry on the resident blocks in both orders beside it (the walk takes
/// the same order from its shared-memory table), interleaved over three
/// rounds (ATTNFORGE_RAGGED_ROUNDS; ATTNFORGE_RAGGED_DRAWS picks draws); the
/// entry the launcher's rule takes is printed beside (since session 47 also for
/// the short- or mid-keys variant a call of the draw takes). Then the
/// sm80-path forward of the same specs (`plan::plan_sm80_path`) in both
/// orders (since session 30). One `ragged ...` line and one `ragged-json
/// {...}` line per cell.
fn ragged_order_ab(rng: &mut rand::rngs::StdRng) {
    // Rounds (ATTNFORGE_RAGGED_ROUNDS, default 3).
    let rounds: usize = std::env::var("ATTNFORGE_RAGGED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // The draws timed (ATTNFORGE_RAGGED_DRAWS, comma-separated; default all four).
    let draws: Option<Vec<String>> = std::env::var("ATTNFORGE_RAGGED_DRAWS")
        .ok()
        .map(|v| v.split(',').map(|x| x.trim().to_string()).collect());
    const DRAWS: [&str; 4] = ["seed11", "bench", "short", "short-b"];
    if let Some(bad) = draws.iter().flatten().find(|x| !DRAWS.contains(&x.as_str())) {
        eprintln!("gpu_bench --ragged-order: ATTNFORGE_RAGGED_DRAWS names `{bad}`; the draws are {DRAWS:?}");
        std::process::exit(2);
    }
    launch::ensure_context(0).expect("context");
    let cc = launch::current_compute_capability().expect("cc");
    let arch = Arch::from_compute_capability(cc.0, cc.1).expect("supported GPU");
    let seed11 = ragged_lens(&mut rand::rngs::StdRng::seed_from_u64(11));
    // Short sequences (64..=1024 tokens, 16k in all): where the launcher's rule
    // walks ragged batches up to d128 (keys up to 1024, or 2048) and past d128
    // without a mask (under one, since session 47, not). A second draw of the
    // same kind (`short-b`, seed 48; session 48) for rules read off the first.
    let short = short_ragged_lens(46);
    let short_b = short_ragged_lens(48);
    for d in [128usize, 256] {
        let h = 2048 / d;
        for (draw, lens) in [
            ("seed11", seed11.clone()),
            ("bench", bench_ragged_lens(d)),
            ("short", short.clone()),
            ("short-b", short_b.clone()),
        ]
        .into_iter()
        .filter(|(draw, _)| draws.as_ref().is_none_or(|v| v.iter().any(|x| x == draw)))
        {
            for causal in [false, true] {
                let mask = if causal { Mask::CausalBottomRight } else { Mask::None };
                let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Thd, arch);
                let (_bufs, fa) = ragged_problem(d, &lens, rng);
                let planned = attnforge::get_or_build(&spec).expect("forward");
                // The variant a call of this draw takes (the dispatcher picks it by
                // the longest keys; since session 47), where it is not the main plan.
                let max_len = lens.iter().copied().max().unwrap_or(0) as u32;
                let variant = attnforge::plan::Variant::for_keys(&spec, max_len);
                let per_call = (variant != attnforge::plan::Variant::Main).then(|| {
                    attnforge::Jit::global()
                        .get_or_build_variant(&spec, variant)
                        .map(|k| (*k).clone())
                        .map_err(|e| format!("no {variant:?} forward ({e})"))
                });
                let sm80 = attnforge::plan::plan_sm80_path(&spec)
                    .map_err(|e| e.to_string())
                    .and_then(|plan| attnforge::jit::build_plan(plan).map_err(|e| e.to_string()))
                    .map_err(|e| format!("no sm80-path forward ({e})"));
                let kernels = std::iter::once(Ok((*planned).clone()))
                    .chain(per_call)
                    .chain(std::iter::once(sm80));
                for k in kernels {
                    let k = match k {
                        Ok(k) => k,
                        Err(e) => {
                            println!("ragged {spec} {draw}: {e}");
                            continue;
                        }
                    };
                    let lk = launch::load(&k).expect("load");
                    // The sm80 path has one entry; the sm90a kernels are timed on their
                    // one-tile entry (and the walk below), the per-call variant's named.
                    let (entry, rule) = if k.plan.template == attnforge::plan::Template::FwdSm80 {
                        ("sm80 path".to_string(), "sm80 path".to_string())
                    } else {
                        let tag = variant_label(k.variant);
                        (format!("one tile{tag}"), format!("{}{tag}", entry_of(&lk, &fa).trim()))
                    };
                    let flops = ragged_flops(&lens, h, d, causal);
                    // SAFETY: buffers sized for the problem.
                    let mut run = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") };
                    // The entries timed: the one-tile entry, and (since session 46)
                    // the walk on the resident blocks where the kernel has one.
                    let mut entries = vec![(entry, launch::ONE_TILE)];
                    if lk.has_walk() {
                        entries.push((format!("walk{}", variant_label(k.variant)), lk.resident_blocks()));
                    }
                    // TFLOP/s per entry of off (0) and on (1), interleaved over
                    // the rounds, each round in the other order than the one before.
                    let mut figures = vec![[Vec::new(), Vec::new()]; entries.len()];
                    let configs: Vec<(usize, bool)> =
                        (0..entries.len()).flat_map(|e| [(e, false), (e, true)]).collect();
                    for round in 0..rounds {
                        let order: Vec<_> = if round % 2 == 0 {
                            configs.clone()
                        } else {
                            configs.iter().rev().copied().collect()
                        };
                        for (e, on) in order {
                            lk.set_persistent_grid(entries[e].1);
                            lk.set_ragged_order(on);
                            let ms = time_ms(&mut run, 5.0, 25.0);
                            figures[e][on as usize].push(flops / ms / 1e9);
                        }
                    }
                    lk.set_ragged_order(launch::RAGGED_ORDER_DEFAULT);
                    lk.set_persistent_grid(0);
                    let one_tile_on = median(&figures[0][1]);
                    for (e, (name, _)) in entries.iter().enumerate() {
                        let (off, on) = (median(&figures[e][0]), median(&figures[e][1]));
                        let change = (on / off - 1.0) * 100.0;
                        // The walk against the one-tile entry (both longest first); the
                        // first entry has no other to compare with.
                        let vs_one_tile = (e > 0).then(|| (on / one_tile_on - 1.0) * 100.0);
                        let vs = vs_one_tile.map_or(String::new(), |v| {
                            format!(", longest first vs the one-tile entry's {v:+5.1}%")
                        });
                        println!(
                            "ragged {spec} {draw} ({} seqs {}..{}) {name}: batch order {off:7.1} TFLOP/s, \
                         longest first {on:7.1} TFLOP/s {change:+5.1}%{vs} (rule's entry: {rule})",
                            lens.len(),
                            lens.iter().min().unwrap(),
                            lens.iter().max().unwrap()
                        );
                        let row = serde_json::json!({
                            "spec": spec.to_string(), "draw": draw, "ragged_lens": lens, "h": h, "d": d,
                            "causal": causal, "entry": name, "rule_entry": rule,
                            "batch_order_tflops": figures[e][0], "longest_first_tflops": figures[e][1],
                            "batch_order_median": off, "longest_first_median": on, "change_pct": change,
                            "longest_first_vs_one_tile_pct": vs_one_tile,
                        });
                        println!("ragged-json {row}");
                    }
                }
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        let spec: AttnSpec = match args.get(i + 1).map(|s| s.parse()) {
            Some(Ok(spec)) => spec,
            _ => {
                eprintln!("usage: gpu_bench --one SPEC [--path sm80] [--seqlen S]");
                std::process::exit(2);
            }
        };
        if !launch::driver_available() {
            eprintln!("skipped: no CUDA driver");
            return;
        }
        let sm80 = args.windows(2).any(|w| w[0] == "--path" && w[1] == "sm80");
        let s = args
            .windows(2)
            .find(|w| w[0] == "--seqlen")
            .and_then(|w| w[1].parse().ok())
            .unwrap_or(8192);
        one(&spec, sm80, s, &mut rand::rngs::StdRng::seed_from_u64(13));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--ab"))
        .map(|(_, a)| a.clone());
    if args.iter().any(|a| a == "--trace80b") {
        trace80b(&mut rand::rngs::StdRng::seed_from_u64(5));
        return;
    }
    if args.iter().any(|a| a == "--trace80f") {
        trace80f(&mut rand::rngs::StdRng::seed_from_u64(6));
        return;
    }
    if args.iter().any(|a| a == "--trace90") {
        trace90(&mut rand::rngs::StdRng::seed_from_u64(5));
        return;
    }
    if args.iter().any(|a| a == "--phases") {
        if !launch::driver_available() {
            eprintln!("skipped: no CUDA driver");
            return;
        }
        phases(&mut rand::rngs::StdRng::seed_from_u64(17));
        return;
    }
    if args.iter().any(|a| a == "--ragged-order") {
        if !launch::driver_available() {
            eprintln!("skipped: no CUDA driver");
            return;
        }
        ragged_order_ab(&mut rand::rngs::StdRng::seed_from_u64(19));
        return;
    }
    if args.iter().any(|a| a == "--tune90") {
        tune90(&mut rand::rngs::StdRng::seed_from_u64(7));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--ab") {
        if !launch::driver_available() {
            eprintln!("skipped: no CUDA driver");
            return;
        }
        let dirs = args.get(i + 1).cloned().unwrap_or_else(|| ".gpu/ab".into());
        ab(
            &dirs.split(',').collect::<Vec<_>>(),
            &mut rand::rngs::StdRng::seed_from_u64(11),
        );
        return;
    }
    if !launch::driver_available() {
        eprintln!("skipped: no CUDA driver");
        return;
    }
    launch::ensure_context(0).expect("context");
    let cc = launch::current_compute_capability().expect("cc");
    let arch = Arch::from_compute_capability(cc.0, cc.1).expect("supported GPU");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    if args.iter().any(|a| a == "--tune") {
        tune(arch, &mut rng);
        return;
    }
    let mut rows = Vec::new();
    let seqs: &[usize] = if quick {
        &[2048, 16384]
    } else {
        &[512, 2048, 8192, 16384]
    };
    for d in [64usize, 128, 256] {
        let h = 2048 / d;
        for &s in seqs {
            let b = (16384 / s).max(1);
            for causal in [false, true] {
                let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
                let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, arch);
                let t0 = Instant::now();
                // The kernel a call of this length takes (the short-keys variant where the spec has one).
                let variant = attnforge::plan::Variant::for_keys(&spec, s as u32);
                let k = match attnforge::Jit::global().get_or_build_variant(&spec, variant) {
                    Ok(k) => k,
                    Err(e) => {
                        eprintln!("{spec}: {e}");
                        continue;
                    }
                };
                let build_ms = t0.elapsed().as_secs_f64() * 1e3;
                let lk = launch::load(&k).expect("load");
                let n = b * h * s * d;
                let (q, kk, v) = (
                    Dev::random(n, &mut rng),
                    Dev::random(n, &mut rng),
                    Dev::random(n, &mut rng),
                );
                let o = Dev::zeroed(n * 2);
                let lse = Dev::zeroed(b * h * s * 4);
                let t = |p| TensorArg::bhsd(p, s as i64, h as i64, d as i64);
                let fa = bhsd_args([q.0, kk.0, v.0, o.0], lse.0, b, h, s, d);
                // SAFETY: buffers sized for the problem.
                let launch = || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") };
                let ms = time_ms(launch, 25.0, 100.0);
                // SAFETY: as above.
                let b2b_ms = time_back_to_back_ms(launch, 10, 7);
                let flops = 4.0 * (b * h * s * s * d) as f64 * if causal { 0.5 } else { 1.0 };
                let tf = flops / ms / 1e9;
                let entry = entry_of(&lk, &fa);
                println!(
                    "{spec:<40} b={b:<3} h={h:<3} s={s:<6} {ms:8.3} ms {tf:7.1} TFLOP/s{entry} (back to back {:.1}; regs {}, build {build_ms:.0} ms)",
                    flops / b2b_ms / 1e9,
                    k.meta.registers
                );
                let mut row = serde_json::json!({
                    "impl": "attnforge", "spec": spec.to_string(), "b": b, "h": h, "s": s, "d": d,
                    "causal": causal, "fwd_ms": ms, "fwd_tflops": tf, "registers": k.meta.registers,
                    "fwd_tflops_back_to_back": flops / b2b_ms / 1e9,
                    "template": format!("{}{entry}{}", k.plan.template.file(), tile_label(&k)),
                });
                // The sm80 instruction path on the same problem, where the planner chose another template.
                if let Some(tf80) = time_sm80_path(&spec, &k, &fa, flops) {
                    row["fwd_sm80_tflops"] = tf80.into();
                }
                // Backward of the same problem (fast mode), after a forward for O and LSE.
                let bspec = AttnSpec {
                    direction: attnforge::Direction::Bwd,
                    ..spec
                };
                // The planner's backward and, where that is the wgmma backward,
                // the sm80 instruction path's on the same inputs.
                let d_o = Dev::random(n, &mut rng);
                let (dq, dk, dv) = (Dev::zeroed(n * 2), Dev::zeroed(n * 2), Dev::zeroed(n * 2));
                let dsum = Dev::zeroed(b * h * s * 4);
                let time_bwd = |bk: &attnforge::CompiledKernel| -> f64 {
                    let bl = launch::load(bk).expect("load bwd");
                    let ws_bytes = launch_bwd::bwd_workspace_bytes(&bk.plan, &fa.problem);
                    let ws = Dev::zeroed(ws_bytes.max(16) as usize);
                    let ba = launch_bwd::BwdArgs {
                        q: fa.q,
                        k: fa.k,
                        v: fa.v,
                        o: fa.o,
                        d_o: t(d_o.0),
                        lse: fa.lse.expect("the forward's LSE"),
                        dsum: dsum.0,
                        dq: t(dq.0),
                        dk: t(dk.0),
                        dv: t(dv.0),
                        problem: fa.problem.clone(),
                    };
                    // SAFETY: buffers sized for the problem; the forward above filled O and LSE.
                    time_ms(
                        || unsafe {
                            launch_bwd::launch_bwd(&bl, &ba, ws.0, ws_bytes, std::ptr::null_mut()).expect("bwd")
                        },
                        10.0,
                        50.0,
                    )
                };
                if let Ok(bk) = attnforge::get_or_build(&bspec) {
                    let bms = time_bwd(&bk);
                    let btf = 2.5 * flops / bms / 1e9;
                    println!(
                        "{bspec:<40} b={b:<3} h={h:<3} s={s:<6} {bms:8.3} ms {btf:7.1} TFLOP/s ({})",
                        bk.plan.template.file()
                    );
                    row["bwd_ms"] = bms.into();
                    row["bwd_tflops"] = btf.into();
                    row["bwd_template"] = bk.plan.template.file().into();
                }
                // The sm80 instruction path on the same inputs where the planner
                // took the wgmma backward (issue 3 measures that path on the H200).
                let planned_sm80 =
                    row.get("bwd_template").and_then(|t| t.as_str()) == Some(attnforge::plan::Template::BwdSm80.file());
                let alternatives = [(
                    "bwd_sm80_tflops",
                    "sm80 path",
                    attnforge::plan::plan_bwd::plan_bwd_sm80(&bspec).filter(|_| !planned_sm80),
                )];
                for (field, what, plan) in alternatives {
                    let Some(plan) = plan else { continue };
                    match attnforge::jit::build_plan(plan) {
                        Ok(k) => {
                            let ms = time_bwd(&k);
                            let tf = 2.5 * flops / ms / 1e9;
                            println!("{bspec:<40} b={b:<3} h={h:<3} s={s:<6} {ms:8.3} ms {tf:7.1} TFLOP/s ({what})");
                            row[field] = tf.into();
                        }
                        Err(e) => println!("{bspec}: {what} build failed: {e}"),
                    }
                }
                rows.push(row);
            }
        }
    }
    // Ragged THD: 16k tokens in sequences of random length 128..4096, d128 and d256.
    for d in [128usize, 256] {
        let h = 2048 / d;
        let lens = ragged_lens(&mut rng);
        let total: usize = lens.iter().sum();
        for causal in [false, true] {
            let mask = if causal { Mask::CausalBottomRight } else { Mask::None };
            let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Thd, arch);
            let max_len = lens.iter().copied().max().unwrap_or(0) as u32;
            let variant = attnforge::plan::Variant::for_keys(&spec, max_len);
            let Ok(k) = attnforge::Jit::global().get_or_build_variant(&spec, variant) else {
                continue;
            };
            let lk = launch::load(&k).expect("load");
            let (_buffers, fa) = ragged_problem(d, &lens, &mut rng);
            // SAFETY: buffers sized for the problem.
            let ms = time_ms(
                || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") },
                25.0,
                100.0,
            );
            let entry = entry_of(&lk, &fa);
            let flops = ragged_flops(&lens, h, d, causal);
            let tf = flops / ms / 1e9;
            println!(
                "{spec:<40} ragged {} seqs, {total} tokens {ms:8.3} ms {tf:7.1} TFLOP/s{entry}",
                lens.len()
            );
            let mut row = serde_json::json!({
                "impl": "attnforge", "spec": spec.to_string(), "ragged_lens": lens, "h": h, "d": d,
                "causal": causal, "fwd_ms": ms, "fwd_tflops": tf, "registers": k.meta.registers,
                "template": format!("{}{entry}{}", k.plan.template.file(), tile_label(&k)),
            });
            if let Some(tf80) = time_sm80_path(&spec, &k, &fa, flops) {
                row["fwd_sm80_tflops"] = tf80.into();
            }
            rows.push(row);
        }
    }
    // GQA 64/8 at d128, 8k (batch 2): the configuration of the published
    // FlashAttention-4 figure on the H200 that issue 4 names (756 TFLOP/s
    // non-causal), with its peers in the same run (scripts/gpu_bench.py).
    if !quick {
        let (b, hq, hkv, s, d) = (2usize, 64usize, 8usize, 8192usize, 128usize);
        for causal in [false, true] {
            let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
            let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, Layout::Dense, arch);
            let variant = attnforge::plan::Variant::for_keys(&spec, s as u32);
            let Ok(k) = attnforge::Jit::global().get_or_build_variant(&spec, variant) else {
                continue;
            };
            let lk = launch::load(&k).expect("load");
            let (nq, nkv) = (b * hq * s * d, b * hkv * s * d);
            let (q, kk, v) = (
                Dev::random(nq, &mut rng),
                Dev::random(nkv, &mut rng),
                Dev::random(nkv, &mut rng),
            );
            let o = Dev::zeroed(nq * 2);
            let lse = Dev::zeroed(b * hq * s * 4);
            let mut fa = bhsd_args([q.0, kk.0, v.0, o.0], lse.0, b, hq, s, d);
            fa.k = TensorArg::bhsd(kk.0, s as i64, hkv as i64, d as i64);
            fa.v = TensorArg::bhsd(v.0, s as i64, hkv as i64, d as i64);
            fa.problem.heads_kv = hkv as u32;
            // SAFETY: buffers sized for the problem (K and V with hkv heads).
            let ms = time_ms(
                || unsafe { launch::launch_fwd(&lk, &fa, std::ptr::null_mut()).expect("launch") },
                25.0,
                100.0,
            );
            let flops = 4.0 * (b * hq * s * s * d) as f64 * if causal { 0.5 } else { 1.0 };
            let tf = flops / ms / 1e9;
            let entry = entry_of(&lk, &fa);
            println!("{spec:<40} b={b:<3} h={hq}/{hkv} s={s:<6} {ms:8.3} ms {tf:7.1} TFLOP/s{entry} (GQA)");
            rows.push(serde_json::json!({
                "impl": "attnforge", "spec": spec.to_string(), "b": b, "h": hq, "hkv": hkv, "s": s, "d": d,
                "causal": causal, "fwd_ms": ms, "fwd_tflops": tf, "registers": k.meta.registers,
                "template": format!("{}{entry}{}", k.plan.template.file(), tile_label(&k)),
            }));
        }
    }
    // SAFETY: final sync; any asynchronous launch failure shows here.
    unsafe { sys::cuCtxSynchronize() }.result().expect("kernels");
    if let Some(path) = out {
        std::fs::write(&path, serde_json::to_string_pretty(&rows).unwrap()).expect("write json");
    }
}
