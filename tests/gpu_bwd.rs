//! GPU correctness suite for the generated backward kernels.
//!
//! Data-driven like `gpu_fwd`: one table of cases (spec, shapes, memory
//! layout, window, softcap) runs through the whole pipeline — spec → plan →
//! render → NVRTC → cache → load → launch on a stream. Each case draws random
//! Q, K, V, dO, runs our forward kernel for O and LSE, poisons dQ, dK, dV,
//! Dsum and the workspace (0xFF bytes = NaN), runs the backward, and compares
//! dQ, dK, dV with the f64 reference `attnforge::reference::attention_bwd`
//! (relative L2 error per tensor). Every output element must be written and
//! finite, rows that see no key must get exactly zero dQ, and deterministic
//! specs run twice and must match bitwise.
//!
//! Needs a CUDA GPU; without one it prints a skip line and passes. On Hopper
//! the sm80-path specs run as their `.sm90a` build. `ATTNFORGE_GPU_CASES=a,b`
//! runs only the cases whose spec contains `a` or `b`; `ATTNFORGE_SEED` fixes the
//! inputs; `ATTNFORGE_BWD_BENCH=1` adds a timing table (informational).

mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use attnforge::launch::{self, FwdArgs, FwdProblem, TensorArg};
use attnforge::launch_bwd::{self, BwdArgs};
use attnforge::plan::plan_bwd::BwdTiles;
use attnforge::reference::{attention_bwd, visible, RefProblem};
use attnforge::{AttnSpec, DType, Direction, Layout};
use common::{dense, from_bits, normal, off, thd, to_bits, Buf, Case, Mem};
use cudarc::driver::sys;
use rand::SeedableRng;

/// The table. Odd sizes on purpose: 1, 17, 127, 1000; sq != sk both ways
/// (sq > sk under bottom-right causal leaves rows that see no key); GQA
/// 1/4/8; ragged batches with empty and one-token sequences; every mask,
/// softcap, deterministic mode, head dims 40 (padded), 64, 128, 192/128, 256.
fn cases() -> Vec<Case> {
    vec![
        dense("bwd.bf16.d128.none.dense.sm80", 2, 4, 4, 1000, 1000),
        dense("bwd.f16.d128.none.dense.sm80", 2, 4, 4, 1000, 1000).mem(Mem::Mixed),
        dense("bwd.bf16.d64.none.dense.sm80", 2, 4, 4, 127, 1000),
        dense("bwd.f16.d64.none.dense.sm80", 1, 8, 1, 1, 1000),
        dense("bwd.bf16.d128.causal-tl.dense.sm80", 1, 4, 4, 1000, 1000),
        dense("bwd.bf16.d128.causal-br.dense.sm80", 1, 8, 2, 17, 1000),
        dense("bwd.f16.d64.causal-br.dense.sm80", 1, 4, 4, 1000, 127).mem(Mem::Bhsd),
        dense("bwd.f16.d64.causal-tl.dense.sm80", 1, 4, 4, 1000, 127),
        dense("bwd.bf16.d128.window.dense.sm80", 2, 8, 2, 1000, 1000).window(100, 0),
        dense("bwd.f16.d128.window.dense.sm80", 1, 4, 4, 127, 1000).window(37, 64),
        dense("bwd.bf16.d64.window.dense.sm80", 1, 4, 4, 1000, 1000)
            .window(-1, 17)
            .mem(Mem::Bhsd),
        dense("bwd.bf16.d128.none.dense.softcap.sm80", 1, 4, 4, 1000, 1000).softcap(30.0),
        dense("bwd.f16.d64.causal-br.dense.softcap.sm80", 1, 4, 4, 127, 127).softcap(5.0),
        dense("bwd.bf16.d128.causal-br.dense.det.sm80", 1, 8, 2, 1000, 1000).mem(Mem::Mixed),
        dense("bwd.f16.d128.none.dense.det.sm80", 2, 4, 4, 17, 127),
        dense("bwd.bf16.d256.none.dense.sm80", 1, 2, 2, 257, 513),
        // GQA 4 without a mask, more keys than queries and more queries than
        // keys. On Hopper the d64 case also runs the wgmma backward, whose
        // blocks start their walks on their own diagonal and wrap into the
        // group's first query head (walk_rotation; blocks past the last query
        // tile start at 0).
        dense("bwd.bf16.d256.none.dense.sm80", 1, 8, 2, 600, 1000),
        dense("bwd.f16.d64.none.dense.sm80", 2, 8, 2, 1000, 300),
        dense("bwd.f16.d256.causal-br.dense.softcap.det.sm80", 1, 2, 1, 300, 300).softcap(20.0),
        // d256 fast mode under masks (dK's k-steps inside the dQ phase, dk_in_dq,
        // on dense specs; not on ragged ones).
        dense("bwd.bf16.d256.causal-br.dense.sm80", 1, 4, 2, 1000, 300),
        dense("bwd.f16.d256.window.dense.softcap.sm80", 1, 2, 2, 300, 517)
            .window(100, 17)
            .softcap(20.0),
        thd(
            "bwd.bf16.d256.causal-tl.thd.sm80",
            4,
            2,
            &[(300, 300), (0, 0), (17, 64), (1, 1)],
        ),
        dense("bwd.bf16.d40.causal-tl.dense.sm80", 1, 4, 2, 127, 127),
        // The rest of the head-dim family (the head-dim group of the coverage matrix).
        dense("bwd.bf16.d32.causal-br.dense.sm80", 2, 4, 2, 300, 517),
        dense("bwd.f16.d96.none.dense.sm80", 1, 4, 4, 127, 300),
        dense("bwd.bf16.d160.window.dense.sm80", 1, 4, 1, 300, 300).window(64, 64),
        dense("bwd.bf16.d192.causal-br.dense.sm80", 1, 2, 2, 257, 257),
        dense("bwd.f16.d224.none.dense.sm80", 1, 2, 1, 17, 300),
        dense("bwd.bf16.d192v128.causal-br.dense.sm80", 1, 4, 2, 200, 300),
        thd(
            "bwd.bf16.d128.none.thd.sm80",
            4,
            4,
            &[(0, 0), (1, 1), (1000, 1000), (17, 300), (127, 0), (300, 17)],
        ),
        thd(
            "bwd.f16.d64.causal-br.thd.sm80",
            8,
            2,
            &[(17, 17), (0, 5), (1, 1000), (1000, 127), (255, 256)],
        ),
        thd(
            "bwd.bf16.d128.causal-tl.thd.sm80",
            4,
            4,
            &[(1000, 1000), (1, 1), (64, 200)],
        ),
        thd(
            "bwd.f16.d64.window.thd.softcap.det.sm80",
            4,
            1,
            &[(500, 700), (0, 0), (33, 33), (1, 1)],
        )
        .window(64, 8)
        .softcap(20.0),
        thd(
            "bwd.bf16.d128.causal-br.thd.det.sm90a",
            8,
            1,
            &[(300, 300), (0, 7), (129, 1)],
        ),
        dense("bwd.bf16.d128.none.dense.sm90a", 1, 8, 1, 1000, 1000),
    ]
}

/// Relative L2 error bound of dQ, dK and dV per dtype.
fn bound(dt: DType) -> f64 {
    match dt {
        DType::Bf16 => 2e-2,
        DType::F16 => 5e-3,
    }
}

struct Outcome {
    /// Relative L2 error of dQ, dK, dV.
    rel: [f64; 3],
    /// Deterministic specs: whether a second run matched bitwise.
    repeat_equal: Option<bool>,
    problems: Vec<String>,
}

/// Reference dQ, dK, dV of one (sequence, kv head) unit.
type Grads = (Vec<f64>, Vec<f64>, Vec<f64>);

fn fwd_of(spec: &AttnSpec) -> AttnSpec {
    AttnSpec {
        direction: Direction::Fwd,
        deterministic: false,
        ..*spec
    }
}

/// Running squared error and squared reference norm of one output tensor.
#[derive(Default)]
struct Err2 {
    err: f64,
    norm: f64,
}

impl Err2 {
    fn add(&mut self, got: f64, want: f64, what: impl FnOnce() -> String, problems: &mut Vec<String>) {
        if !got.is_finite() {
            if problems.len() < 6 {
                problems.push(format!("{} = {got} (unwritten or NaN)", what()));
            }
            self.err = f64::INFINITY;
        } else {
            self.err += (got - want).powi(2);
        }
        self.norm += want * want;
    }
    fn rel(&self) -> f64 {
        if self.norm > 0.0 {
            (self.err / self.norm).sqrt()
        } else {
            self.err.sqrt()
        }
    }
}

/// Run one case; `kernel` overrides the planner's backward kernel (the sm80
/// path where the planner takes the wgmma backward); `phases` forces the
/// causal block order's phases (`LoadedKernel::set_tile_phases`; 0 = the rule).
fn run_case(
    c: &Case,
    spec: AttnSpec,
    kernel: Option<&attnforge::CompiledKernel>,
    phases: u32,
    rng: &mut rand::rngs::StdRng,
) -> Outcome {
    let dt = spec.dtype;
    let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let (hq, hkv) = (c.heads_q, c.heads_kv);
    let ratio = hq / hkv;
    let is_thd = spec.layout == Layout::Thd;
    let lens: Vec<(usize, usize)> = if is_thd {
        c.lens.clone()
    } else {
        vec![c.lens[0]; c.batch]
    };
    let sq_max = lens.iter().map(|l| l.0).max().unwrap_or(0);
    let sk_max = lens.iter().map(|l| l.1).max().unwrap_or(0);
    let total_q: usize = lens.iter().map(|l| l.0).sum();
    let total_k: usize = lens.iter().map(|l| l.1).sum();
    let prefix = |which: usize| -> Vec<i32> {
        let mut v = vec![0i32];
        for l in &lens {
            let x = if which == 0 { l.0 } else { l.1 };
            v.push(v.last().unwrap() + x as i32);
        }
        v
    };
    let (cu_q, cu_k) = (prefix(0), prefix(1));
    // Token of sequence b's first row (dense: 0 within its batch entry) and the batch index.
    let tok = |b: usize, which: usize| -> usize {
        if is_thd {
            (if which == 0 { cu_q[b] } else { cu_k[b] }) as usize
        } else {
            0
        }
    };
    let bidx = |b: usize| if is_thd { 0 } else { b };

    let (inputs_mem, grads_mem) = match c.mem {
        Mem::Mixed => (Mem::Bshd, Mem::Bhsd),
        Mem::PackedQkv => panic!("{}: the backward suite has no packed-qkv layout", c.spec),
        m => (m, m),
    };
    let mk = |mem: Mem, s: usize, h: usize, d: usize| -> TensorArg {
        if is_thd {
            TensorArg::thd(0, h as i64, d as i64)
        } else if mem == Mem::Bhsd {
            TensorArg::bhsd(0, s as i64, h as i64, d as i64)
        } else {
            TensorArg::bshd(0, s as i64, h as i64, d as i64)
        }
    };
    let tq = mk(inputs_mem, sq_max, hq, dq);
    let tk = mk(inputs_mem, sk_max, hkv, dq);
    let tv = mk(inputs_mem, sk_max, hkv, dv);
    let to = mk(inputs_mem, sq_max, hq, dv);
    let tdo = mk(grads_mem, sq_max, hq, dv);
    let tdq = mk(grads_mem, sq_max, hq, dq);
    let tdk = mk(grads_mem, sk_max, hkv, dq);
    let tdv = mk(grads_mem, sk_max, hkv, dv);
    let rows_q = if is_thd { total_q } else { c.batch * sq_max };
    let rows_k = if is_thd { total_k } else { c.batch * sk_max };
    let (n_q, n_k, n_v, n_o) = (rows_q * hq * dq, rows_k * hkv * dq, rows_k * hkv * dv, rows_q * hq * dv);

    // Random inputs, rounded to the element type; the reference sees the rounded values.
    let mut fill = |n: usize| -> Vec<u16> { (0..n).map(|_| to_bits(normal(rng), dt)).collect() };
    let (h_q, h_k, h_v, h_do) = (fill(n_q), fill(n_k), fill(n_v), fill(n_o));
    let (b_q, b_k, b_v, b_do) = (
        Buf::upload(&h_q),
        Buf::upload(&h_k),
        Buf::upload(&h_v),
        Buf::upload(&h_do),
    );
    let b_o = Buf::new(n_o * 2);
    b_o.poison();
    let lse_len = if is_thd { hq * total_q } else { c.batch * hq * sq_max };
    let b_lse = Buf::new(lse_len * 4);
    b_lse.poison();
    let b_cu_q = Buf::upload(&cu_q);
    let b_cu_k = Buf::upload(&cu_k);
    let with = |t: TensorArg, base: u64| TensorArg { ptr: base + t.ptr, ..t };
    let problem = FwdProblem {
        batch: c.batch as u32,
        heads_q: hq as u32,
        heads_kv: hkv as u32,
        seqlen_q: sq_max as u32,
        seqlen_k: sk_max as u32,
        cu_seqlens_q: is_thd.then_some(b_cu_q.ptr),
        cu_seqlens_k: is_thd.then_some(b_cu_k.ptr),
        total_q: total_q as u32,
        total_k: total_k as u32,
        scale: None,
        softcap: c.softcap,
        window: c.window,
    };
    let mut problems = Vec::new();

    // Forward with our kernel: O and LSE.
    let fwd = fwd_of(&spec);
    let fk = match attnforge::get_or_build(&fwd) {
        Ok(k) => k,
        Err(e) => {
            return Outcome {
                rel: [f64::INFINITY; 3],
                repeat_equal: None,
                problems: vec![format!("{fwd}: {e}")],
            }
        }
    };
    let fargs = FwdArgs {
        q: with(tq, b_q.ptr),
        k: with(tk, b_k.ptr),
        v: with(tv, b_v.ptr),
        o: with(to, b_o.ptr),
        lse: Some(b_lse.ptr),
        problem: problem.clone(),
    };
    let floaded = launch::load(&fk).expect("load fwd");
    // SAFETY: buffers sized for the shapes above, null stream.
    unsafe { launch::launch_fwd(&floaded, &fargs, std::ptr::null_mut()) }.expect("launch fwd");

    // Backward.
    let bk = match kernel
        .map(|k| Ok(std::sync::Arc::new(k.clone())))
        .unwrap_or_else(|| attnforge::get_or_build(&spec))
    {
        Ok(k) => k,
        Err(e) => {
            return Outcome {
                rel: [f64::INFINITY; 3],
                repeat_equal: None,
                problems: vec![format!("{spec}: {e}")],
            }
        }
    };
    let (b_dq, b_dk, b_dv) = (Buf::new(n_q * 2), Buf::new(n_k * 2), Buf::new(n_v * 2));
    let b_dsum = Buf::new(lse_len * 4);
    let ws_bytes = launch_bwd::bwd_workspace_bytes(&bk.plan, &problem);
    let b_ws = Buf::new(ws_bytes as usize);
    let bargs = BwdArgs {
        q: with(tq, b_q.ptr),
        k: with(tk, b_k.ptr),
        v: with(tv, b_v.ptr),
        o: with(to, b_o.ptr),
        d_o: with(tdo, b_do.ptr),
        lse: b_lse.ptr,
        dsum: b_dsum.ptr,
        dq: with(tdq, b_dq.ptr),
        dk: with(tdk, b_dk.ptr),
        dv: with(tdv, b_dv.ptr),
        problem: problem.clone(),
    };
    let bloaded = launch::load(&bk).expect("load bwd");
    bloaded.set_tile_phases(phases);
    let run_bwd = || -> (Vec<u16>, Vec<u16>, Vec<u16>) {
        for b in [&b_dq, &b_dk, &b_dv, &b_dsum, &b_ws] {
            b.poison();
        }
        // SAFETY: buffers sized for the shapes above; workspace of the stated size; null stream.
        unsafe { launch_bwd::launch_bwd(&bloaded, &bargs, b_ws.ptr, ws_bytes, std::ptr::null_mut()) }
            .expect("launch bwd");
        // SAFETY: synchronize the context; a kernel fault surfaces here.
        unsafe { sys::cuCtxSynchronize() }.result().expect("kernel execution");
        (b_dq.download(n_q), b_dk.download(n_k), b_dv.download(n_v))
    };
    let (g_dq, g_dk, g_dv) = run_bwd();
    let repeat_equal = spec.deterministic.then(|| {
        let again = run_bwd();
        again.0 == g_dq && again.1 == g_dk && again.2 == g_dv
    });
    bloaded.set_tile_phases(0);

    // The reference, per (sequence, kv head), in parallel.
    let scale = 1.0 / (dq as f64).sqrt();
    let units: Vec<(usize, usize)> = (0..c.batch).flat_map(|b| (0..hkv).map(move |k| (b, k))).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Grads>>> = Mutex::new(vec![None; units.len()]);
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let u = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(bi, hk)) = units.get(u) else { break };
                let (lq, lk) = lens[bi];
                let gather =
                    |host: &[u16], t: &TensorArg, which: usize, len: usize, heads: std::ops::Range<usize>, d: usize| {
                        let mut out = Vec::with_capacity(len * heads.len() * d);
                        for si in 0..len {
                            for hh in heads.clone() {
                                for cc in 0..d {
                                    out.push(from_bits(host[off(t, bidx(bi), tok(bi, which) + si, hh, cc)], dt));
                                }
                            }
                        }
                        out
                    };
                let group = hk * ratio..(hk + 1) * ratio;
                let q = gather(&h_q, &tq, 0, lq, group.clone(), dq);
                let d_o = gather(&h_do, &tdo, 0, lq, group, dv);
                let k = gather(&h_k, &tk, 1, lk, hk..hk + 1, dq);
                let v = gather(&h_v, &tv, 1, lk, hk..hk + 1, dv);
                let r = attention_bwd(
                    &RefProblem {
                        q: &q,
                        k: &k,
                        v: &v,
                        seqlen_q: lq,
                        seqlen_k: lk,
                        heads_q: ratio,
                        heads_kv: 1,
                        d_qk: dq,
                        d_v: dv,
                        scale,
                        softcap: c.softcap as f64,
                        mask: spec.mask,
                        window: (c.window.0 as i64, c.window.1 as i64),
                    },
                    &d_o,
                );
                results.lock().unwrap()[u] = Some(r);
            });
        }
    });
    let results = results.into_inner().unwrap();

    let (mut e_dq, mut e_dk, mut e_dv) = (Err2::default(), Err2::default(), Err2::default());
    let mut nonzero_masked = 0usize;
    for (u, &(bi, hk)) in units.iter().enumerate() {
        let (lq, lk) = lens[bi];
        let (rq, rk, rv) = results[u].as_ref().expect("reference result");
        for si in 0..lq {
            let (lo, hi) = visible(
                spec.mask,
                (c.window.0 as i64, c.window.1 as i64),
                si as i64,
                lq as i64,
                lk as i64,
            );
            for j in 0..ratio {
                let h = hk * ratio + j;
                for cc in 0..dq {
                    let got = from_bits(g_dq[off(&tdq, bidx(bi), tok(bi, 0) + si, h, cc)], dt);
                    let want = rq[(si * ratio + j) * dq + cc];
                    e_dq.add(got, want, || format!("dQ[b{bi} s{si} h{h} c{cc}]"), &mut problems);
                    if lo > hi && got != 0.0 {
                        nonzero_masked += 1;
                    }
                }
            }
        }
        for sj in 0..lk {
            for cc in 0..dq {
                let got = from_bits(g_dk[off(&tdk, bidx(bi), tok(bi, 1) + sj, hk, cc)], dt);
                e_dk.add(
                    got,
                    rk[sj * dq + cc],
                    || format!("dK[b{bi} s{sj} h{hk} c{cc}]"),
                    &mut problems,
                );
            }
            for cc in 0..dv {
                let got = from_bits(g_dv[off(&tdv, bidx(bi), tok(bi, 1) + sj, hk, cc)], dt);
                e_dv.add(
                    got,
                    rv[sj * dv + cc],
                    || format!("dV[b{bi} s{sj} h{hk} c{cc}]"),
                    &mut problems,
                );
            }
        }
    }
    if nonzero_masked > 0 {
        problems.push(format!(
            "{nonzero_masked} dQ elements of rows that see no key are not exactly 0"
        ));
    }
    if repeat_equal == Some(false) {
        problems.push("deterministic spec: a second run differs bitwise".into());
    }
    Outcome {
        rel: [e_dq.rel(), e_dk.rel(), e_dv.rel()],
        repeat_equal,
        problems,
    }
}

/// Registers and spills of every entry point of a built kernel, from its ptxas log.
fn resources(spec: &AttnSpec) -> String {
    let Ok(k) = attnforge::get_or_build(spec) else {
        return "build failed".into();
    };
    let mut parts = Vec::new();
    for r in attnforge::compile::parse_ptxas_log(&k.meta.log) {
        let short = r.entry.strip_prefix(&k.plan.entry).unwrap_or(&r.entry);
        let name = if short.is_empty() {
            "main"
        } else {
            short.trim_start_matches('_')
        };
        let spill = r.spill_stores + r.spill_loads;
        parts.push(format!(
            "{name} {}r{}",
            r.registers,
            if spill > 0 {
                format!(" SPILL {spill}B")
            } else {
                String::new()
            }
        ));
    }
    let b = k.plan.bwd.as_ref();
    format!(
        "{}; smem main {} B{}",
        parts.join(", "),
        b.map(|b| b.main_smem).unwrap_or(0),
        b.filter(|b| b.dq_smem > 0)
            .map(|b| format!(", dq {} B", b.dq_smem))
            .unwrap_or_default()
    )
}

/// One dense self-attention problem timed by the bench and the tuning loop:
/// random Q, K, V, dO in BSHD, O and LSE from our forward.
struct BenchProblem {
    spec: AttnSpec,
    b: usize,
    h: usize,
    s: usize,
    bufs: Vec<Buf>,
    args: BwdArgs,
}

impl BenchProblem {
    fn new(spec: AttnSpec, b: usize, h: usize, s: usize, rng: &mut rand::rngs::StdRng) -> Option<BenchProblem> {
        let d = spec.head_dim_qk as usize;
        let n = b * s * h * d;
        let host: Vec<u16> = (0..n).map(|_| to_bits(normal(rng), spec.dtype)).collect();
        let bufs = vec![
            Buf::upload(&host),
            Buf::upload(&host),
            Buf::upload(&host),
            Buf::upload(&host),
            Buf::new(n * 2),
            Buf::new(n * 2),
            Buf::new(n * 2),
            Buf::new(n * 2),
            Buf::new(b * h * s * 4),
            Buf::new(b * h * s * 4),
        ];
        let t = |i: usize| TensorArg::bshd(bufs[i].ptr, s as i64, h as i64, d as i64);
        let problem = FwdProblem {
            batch: b as u32,
            heads_q: h as u32,
            heads_kv: h as u32,
            seqlen_q: s as u32,
            seqlen_k: s as u32,
            window: (-1, -1),
            ..Default::default()
        };
        let fk = attnforge::get_or_build(&fwd_of(&spec)).ok()?;
        let fl = launch::load(&fk).ok()?;
        let fa = FwdArgs {
            q: t(0),
            k: t(1),
            v: t(2),
            o: t(4),
            lse: Some(bufs[8].ptr),
            problem: problem.clone(),
        };
        // SAFETY: buffers sized for the problem; null stream; synchronized.
        unsafe {
            launch::launch_fwd(&fl, &fa, std::ptr::null_mut()).ok()?;
            sys::cuCtxSynchronize().result().ok()?;
        }
        let args = BwdArgs {
            q: t(0),
            k: t(1),
            v: t(2),
            o: t(4),
            d_o: t(3),
            lse: bufs[8].ptr,
            dsum: bufs[9].ptr,
            dq: t(5),
            dk: t(6),
            dv: t(7),
            problem,
        };
        Some(BenchProblem {
            spec,
            b,
            h,
            s,
            bufs,
            args,
        })
    }

    fn flops(&self) -> f64 {
        let causal = if self.spec.mask == attnforge::Mask::None {
            1.0
        } else {
            0.5
        };
        2.5 * 4.0 * (self.b * self.h) as f64 * (self.s * self.s) as f64 * self.spec.head_dim_qk as f64 * causal
    }

    /// Median milliseconds of one whole backward (all its kernels) with `kernel`.
    fn time_ms(&self, kernel: &attnforge::CompiledKernel) -> Option<f64> {
        let bl = launch::load(kernel).ok()?;
        let ws_bytes = launch_bwd::bwd_workspace_bytes(&kernel.plan, &self.args.problem);
        let ws = Buf::new(ws_bytes as usize);
        let run = || {
            // SAFETY: buffers sized for the problem; null stream.
            unsafe { launch_bwd::launch_bwd(&bl, &self.args, ws.ptr, ws_bytes, std::ptr::null_mut()) }.is_ok()
        };
        use cudarc::driver::result::event;
        let (start, stop) = (
            event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ok()?,
            event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ok()?,
        );
        for _ in 0..2 {
            if !run() {
                return None;
            }
        }
        let mut v = Vec::new();
        for _ in 0..5 {
            let iters = 3;
            // SAFETY: events on the legacy default stream.
            unsafe {
                event::record(start, std::ptr::null_mut()).ok()?;
                for _ in 0..iters {
                    run();
                }
                event::record(stop, std::ptr::null_mut()).ok()?;
                event::synchronize(stop).ok()?;
                v.push(event::elapsed(start, stop).ok()? as f64 / iters as f64);
            }
        }
        // SAFETY: any asynchronous launch failure shows here.
        unsafe { sys::cuCtxSynchronize() }.result().ok()?;
        let _ = &self.bufs;
        v.sort_by(|a, b| a.total_cmp(b));
        Some(v[v.len() / 2])
    }
}

fn on_device(spec: &str, cc: (i32, i32), device_arch: attnforge::Arch) -> AttnSpec {
    let spec: AttnSpec = spec.parse().expect("bench spec");
    if cc.0 != 8 {
        spec.with_arch(device_arch)
    } else {
        spec
    }
}

/// `ATTNFORGE_BWD_BENCH=1`: time the whole backward (all its kernels, CUDA
/// events, median) over the standard sweep's shapes (batch·seqlen = 16k
/// tokens, heads·d = 2048, BSHD), after the correctness table. Informational:
/// `scripts/bwd_bench.py` times the peers on the same shapes.
fn bench(cc: (i32, i32), device_arch: attnforge::Arch) {
    let seqs: Vec<usize> = std::env::var("ATTNFORGE_BWD_BENCH_SEQS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2048, 8192]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    println!(
        "\n| spec | batch x heads x seqlen | regs | bwd ms | TFLOP/s (bwd = 2.5 x fwd flops) |\n|---|---|---|---|---|"
    );
    for d in [64usize, 128, 256] {
        for &s in &seqs {
            for mask in ["none", "causal-tl"] {
                let spec = on_device(&format!("bwd.bf16.d{d}.{mask}.dense.sm80"), cc, device_arch);
                let (b, h) = ((16384 / s).max(1), 2048 / d);
                let Ok(k) = attnforge::get_or_build(&spec) else {
                    println!("| {spec} | build failed | | | |");
                    continue;
                };
                let Some(ms) =
                    BenchProblem::new(spec, b, h, s, &mut rng).and_then(|p| Some((p.time_ms(&k)?, p.flops())))
                else {
                    println!("| {spec} | launch failed | | | |");
                    continue;
                };
                println!(
                    "| {spec} | {b} x {h} x {s} | {} | {:.3} | {:.1} |",
                    k.meta.registers,
                    ms.0,
                    ms.1 / ms.0 / 1e9
                );
            }
        }
    }
}

/// Build a backward kernel with an explicit tile shape (tuning), reporting
/// the main kernel's registers and spills; None when the shape does not plan.
fn build_variant(spec: &AttnSpec, tiles: BwdTiles) -> Option<attnforge::CompiledKernel> {
    let plan = attnforge::plan::plan_bwd::plan_bwd_sm80_with(spec, tiles)?;
    attnforge::jit::build_plan(plan)
        .map_err(|e| println!("{spec} {tiles:?}: build failed: {e}"))
        .ok()
}

/// `ATTNFORGE_BWD_TUNE=1`: main-kernel tile variants per head dim: registers
/// and spills from the compiler (no GPU needed), then, on a GPU, the time of
/// the whole backward at batch 4 x seqlen 4096 (heads·d = 2048), non-causal
/// and causal. `ATTNFORGE_BWD_TUNE=d128` limits it to one head dim,
/// `ATTNFORGE_BWD_TUNE=first` to the first variant of each (the v1 tiles).
fn tune(gpu: Option<((i32, i32), attnforge::Arch)>) {
    let only = std::env::var("ATTNFORGE_BWD_TUNE").unwrap_or_default();
    // (warps, block_n, block_m, q_stages (0 = most that fit), acc_chunk (0 = default)).
    let t = |num_warps, block_n, block_m, q_stages, acc_chunk| BwdTiles {
        num_warps,
        block_n,
        block_m,
        q_stages,
        acc_chunk,
        whole_rows: false,
    };
    // Every warp owns whole kv rows (S, dK and dV grids of (warps, 1)): dV and
    // dK from the S phase's registers (kv_in_regs) at any head dim.
    let w = |num_warps, block_n, block_m, acc_chunk| BwdTiles {
        whole_rows: true,
        ..t(num_warps, block_n, block_m, 0, acc_chunk)
    };
    let variants: &[(usize, &[BwdTiles])] = &[
        (
            64,
            &[
                t(8, 128, 64, 0, 0),
                t(8, 128, 128, 0, 0),
                t(8, 128, 128, 0, 16),
                t(4, 128, 64, 0, 0),
                t(4, 128, 64, 0, 32),
                t(4, 64, 64, 1, 0),
                t(8, 256, 64, 0, 0),
                t(8, 256, 64, 1, 0),
            ],
        ),
        (
            128,
            &[
                t(8, 64, 64, 0, 0),
                t(8, 128, 64, 0, 0),
                t(8, 128, 64, 0, 32),
                w(8, 128, 64, 32),
                w(8, 128, 64, 16),
                t(4, 64, 64, 1, 0),
                t(4, 64, 32, 0, 0),
            ],
        ),
        (
            256,
            &[
                t(8, 32, 32, 0, 0),
                t(8, 64, 64, 0, 0),
                t(8, 64, 64, 0, 32),
                t(8, 64, 64, 0, 64),
                t(8, 64, 32, 0, 0),
            ],
        ),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for (d, vs) in variants {
        if only.starts_with('d') && only != format!("d{d}") {
            continue;
        }
        for mask in ["none", "causal-tl"] {
            let spec_str = format!("bwd.bf16.d{d}.{mask}.dense.sm90a");
            let mut spec: AttnSpec = spec_str.parse().expect("tune spec");
            if let Some((cc, arch)) = gpu {
                spec = on_device(&spec_str.replace("sm90a", "sm80"), cc, arch);
            }
            let (b, h, s) = (4, 2048 / d, 4096);
            let problem = gpu.and_then(|_| BenchProblem::new(spec, b, h, s, &mut rng));
            let n = if only == "first" { 1 } else { vs.len() };
            for tiles in vs.iter().take(n) {
                let Some(k) = build_variant(&spec, *tiles) else {
                    println!("tune {spec} {tiles:?}: does not plan");
                    continue;
                };
                let main = attnforge::compile::parse_ptxas_log(&k.meta.log)
                    .into_iter()
                    .find(|r| r.entry == k.plan.entry);
                let (regs, spill) = main
                    .map(|r| (r.registers, r.spill_stores + r.spill_loads))
                    .unwrap_or((0, 0));
                let timing = match (&problem, spill) {
                    (Some(p), 0) => p
                        .time_ms(&k)
                        .map(|ms| format!("{ms:8.3} ms {:6.1} TFLOP/s", p.flops() / ms / 1e9))
                        .unwrap_or_else(|| "launch failed".into()),
                    (_, 0) => String::new(),
                    _ => "spills, not timed".into(),
                };
                let b = k.plan.bwd.as_ref();
                println!(
                    "tune {spec} warps={} bn={:<3} bm={:<3} stages={} chunk={:<2} regs={regs:<3} spill={spill:<5} smem={:<6} {timing}",
                    tiles.num_warps,
                    tiles.block_n,
                    tiles.block_m,
                    b.map_or(0, |b| b.q_stages),
                    b.map_or(0, |b| b.acc_chunk),
                    k.plan.smem_bytes
                );
            }
            // The block order on the planner's own kernels (the sm80 path and,
            // where it takes the spec, the wgmma backward): the head-major
            // default against the old order, all heads of one kv tile first.
            let Some(p) = &problem else { continue };
            use attnforge::plan::plan_bwd::{plan_bwd_sm80, plan_bwd_sm90a};
            for (what, plan) in [
                ("sm80 path", plan_bwd_sm80(&spec)),
                ("wgmma", plan_bwd_sm90a(&spec).ok()),
            ] {
                let Some(plan) = plan else { continue };
                for head_major in [false, true] {
                    let mut plan = plan.clone();
                    plan.head_major = head_major;
                    let timing = attnforge::jit::build_plan(plan)
                        .ok()
                        .and_then(|k| p.time_ms(&k))
                        .map(|ms| format!("{ms:8.3} ms {:6.1} TFLOP/s", p.flops() / ms / 1e9))
                        .unwrap_or_else(|| "build or launch failed".into());
                    println!("tune {spec} {what} planner shape head_major={head_major:<5} {timing}");
                }
            }
        }
    }
}

/// `harness = false`: a plain main, so the skip line is printed in CI logs.
fn main() {
    if std::env::var_os("ATTNFORGE_BWD_TUNE").is_some_and(|v| !v.is_empty() && v != "0") {
        let gpu = attnforge::launch::driver_available()
            .then(|| common::gpu_or_skip("gpu_bwd tune"))
            .flatten();
        tune(gpu);
        return;
    }
    gpu_backward_matches_f64_reference();
    println!("gpu_bwd: done");
}

fn gpu_backward_matches_f64_reference() {
    let Some((cc, device_arch)) = common::gpu_or_skip("gpu_bwd") else {
        return;
    };
    let seed = common::seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    // The table names the sm80 instruction path; SASS does not run across
    // major versions, so an sm80 spec runs as its sm90a build on Hopper.
    let mut todo: Vec<(Case, AttnSpec)> = Vec::new();
    for c in cases() {
        if !common::selected(c.spec) {
            continue;
        }
        let mut spec: AttnSpec = c.spec.parse().expect("case spec");
        if spec.arch == attnforge::Arch::Sm90a && cc != (9, 0) {
            continue;
        }
        if cc.0 != 8 {
            spec = spec.with_arch(device_arch);
        }
        todo.push((c, spec));
    }

    // Build every kernel first, in parallel (NVRTC compiles are independent).
    let mut specs: Vec<AttnSpec> = todo.iter().flat_map(|(_, s)| [*s, fwd_of(s)]).collect();
    specs.sort();
    specs.dedup();
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(spec) = specs.get(i) else { break };
                if let Err(e) = attnforge::get_or_build(spec) {
                    eprintln!("gpu_bwd: build {spec}: {e}");
                }
            });
        }
    });
    println!(
        "gpu_bwd: built {} kernels in {:.1}s with {jobs} jobs",
        specs.len(),
        started.elapsed().as_secs_f64()
    );

    let mut table = String::new();
    let _ = writeln!(table, "seed {seed}, device compute capability {}.{}\n", cc.0, cc.1);
    let _ = writeln!(
        table,
        "| spec | batch x heads (q/kv) | lens (q,k) | memory | window | softcap | dQ rel | dK rel | dV rel | bound | det repeat | result |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut res_table = String::new();
    let _ = writeln!(res_table, "| spec | registers per entry point; shared memory |");
    let _ = writeln!(res_table, "|---|---|");
    let mut failed = 0;
    let mut seen = Vec::new();
    // Every case the planner gives the wgmma backward also runs on the sm80
    // instruction path and, at d <= 64, on the wgmma backward's 64-row query
    // tiles (the planner takes 128-row ones there), so that one H200 run
    // checks every form.
    // Dense causal specs (but softcap, which has no phased order) also run
    // with their blocks in three phases by length (common/order.cuh).
    let mut runs: Vec<(&Case, AttnSpec, Option<attnforge::CompiledKernel>, u32)> = Vec::new();
    for (c, spec) in &todo {
        runs.push((c, *spec, None, 0));
        let causal = matches!(
            spec.mask,
            attnforge::Mask::CausalTopLeft | attnforge::Mask::CausalBottomRight
        );
        if causal && spec.layout == Layout::Dense && !spec.softcap {
            runs.push((c, *spec, None, 3));
        }
        use attnforge::plan::plan_bwd::{plan_bwd_sm80, plan_bwd_sm90a, plan_bwd_sm90a_with, Sm90aBwdOptions};
        if plan_bwd_sm90a(spec).is_ok() {
            let sm80 = plan_bwd_sm80(spec).ok_or_else(|| "no sm80-path plan".to_string());
            let mut alternatives = vec![sm80];
            let planned = Sm90aBwdOptions::planned(spec);
            if planned.tall_query_tiles {
                let short = Sm90aBwdOptions {
                    tall_query_tiles: false,
                };
                alternatives.push(plan_bwd_sm90a_with(spec, short));
            }
            for plan in alternatives {
                match plan.and_then(|plan| attnforge::jit::build_plan(plan).map_err(|e| e.to_string())) {
                    Ok(k) => runs.push((c, *spec, Some(k), 0)),
                    Err(e) => eprintln!("gpu_bwd: build {spec} (an alternative form): {e}"),
                }
            }
        }
    }
    for (c, spec, kernel, phases) in &runs {
        let (c, spec) = (*c, spec);
        let t0 = std::time::Instant::now();
        let out = run_case(c, *spec, kernel.as_ref(), *phases, &mut rng);
        let template = match kernel {
            Some(k) if k.plan.template == attnforge::plan::Template::BwdSm90a && k.plan.block_m == 64 => {
                "bwd_sm90a.cu 64-row query tiles"
            }
            Some(k) => k.plan.template.file(),
            None => attnforge::plan(spec).map_or("?", |p| p.template.file()),
        };
        let label = match phases {
            0 => format!("{spec} [{template}]"),
            n => format!("{spec} [{template}, {n} phases]"),
        };
        let bnd = bound(spec.dtype);
        let ok = out.rel.iter().all(|r| *r <= bnd) && out.problems.is_empty();
        if !ok {
            failed += 1;
        }
        let lens = if c.lens.len() > 3 {
            format!("{:?}…", &c.lens[..3])
        } else {
            format!("{:?}", c.lens)
        };
        let rep = match out.repeat_equal {
            Some(true) => "bitwise equal",
            Some(false) => "DIFFERS",
            None => "-",
        };
        let _ = writeln!(
            table,
            "| {} | {} x {}/{} | {} | {:?} | {:?} | {} | {:.2e} | {:.2e} | {:.2e} | {:.0e} | {} | {} |",
            label,
            c.batch,
            c.heads_q,
            c.heads_kv,
            lens,
            c.mem,
            c.window,
            c.softcap,
            out.rel[0],
            out.rel[1],
            out.rel[2],
            bnd,
            rep,
            if ok {
                "ok".to_string()
            } else {
                format!("FAIL {}", out.problems.join("; "))
            }
        );
        println!(
            "{} {} dq={:.2e} dk={:.2e} dv={:.2e} {} ({:.1}s) {:?}",
            if ok { "ok  " } else { "FAIL" },
            label,
            out.rel[0],
            out.rel[1],
            out.rel[2],
            rep,
            t0.elapsed().as_secs_f64(),
            out.problems
        );
        if !seen.contains(spec) {
            seen.push(*spec);
            let _ = writeln!(res_table, "| {} | {} |", spec, resources(spec));
        }
    }
    let report = format!("{table}\n{res_table}");
    println!("\n{report}");
    if let Ok(dir) = std::env::var("ATTNFORGE_REPORT_DIR") {
        let _ = std::fs::write(std::path::Path::new(&dir).join("gpu-correctness-bwd.md"), &report);
    }
    if std::env::var_os("ATTNFORGE_BWD_BENCH").is_some_and(|v| !v.is_empty() && v != "0") {
        bench(cc, device_arch);
    }
    if failed > 0 {
        eprintln!("gpu_bwd: {failed} GPU correctness case(s) failed");
        std::process::exit(1);
    }
}
