//! Decision tests: real problems through the real rule set.

use std::sync::Arc;

use super::*;
use crate::launch::TensorArg;
use crate::spec::Mask;

const SM80: ComputeCapability = ComputeCapability::new(8, 0);
const SM90: ComputeCapability = ComputeCapability::new(9, 0);

fn torch(policy: Policy) -> Dispatcher {
    let d = Dispatcher::capturing(policy);
    d.register(Arc::new(GeneratedBackend::global())).unwrap();
    d.register_torch().unwrap();
    d
}

fn dense(d: u32) -> Problem {
    Problem::dense(ElemType::Bf16, d, 2, 16, 16, 1024, 1024, SM90)
}

fn rejected_reason<'a>(dd: &'a DirDecision, backend: &str) -> &'a str {
    let r = dd
        .ranked
        .iter()
        .find(|r| r.backend == backend)
        .unwrap_or_else(|| panic!("{backend} not ranked"));
    match &r.verdict {
        Verdict::Rejected(why) => why,
        v => panic!("{backend} not rejected: {v:?}"),
    }
}

fn order(dd: &DirDecision) -> Vec<&'static str> {
    dd.ranked.iter().map(|r| r.backend).collect()
}

/// The note the generated backend gave in a direction's ranking.
fn generated_note(dd: &DirDecision) -> String {
    let row = dd.ranked.iter().find(|r| r.backend == "generated").unwrap();
    row.support.as_ref().unwrap().note.clone().unwrap()
}

#[test]
fn default_ranking_follows_measured_speed() {
    // On a plain problem every backend is eligible; the measured order
    // decides: on Hopper cuDNN, ours (wgmma), FA2 in both directions while
    // the wgmma backward takes the problem; on sm80 ours last in both.
    let d = torch(Policy::auto());
    let p = dense(128).with_mask(Mask::CausalBottomRight).with_grad();
    let mut p80 = p;
    p80.cc = SM80;
    assert_eq!(
        order(&d.decide_problem(&p80).unwrap().fwd),
        ["torch-cudnn", "torch-flash", "generated"]
    );
    let dec = d.decide_problem(&p).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-cudnn");
    assert_eq!(order(&dec.fwd), ["torch-cudnn", "generated", "torch-flash"]);
    assert_eq!(dec.fwd.ranked[1].verdict, Verdict::Eligible);
    assert_eq!(dec.fwd.ranked[2].verdict, Verdict::Eligible);
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-cudnn");
    assert_eq!(order(&dec.bwd), ["torch-cudnn", "generated", "torch-flash"]);
    assert_eq!(dec.bwd.ranked[2].verdict, Verdict::Eligible);
    assert_eq!(
        order(&d.decide_problem(&p80).unwrap().bwd),
        ["torch-cudnn", "torch-flash", "generated"]
    );
    // d256 (the sm80 path on Hopper, measured ahead of FA2 too): between
    // them; the deterministic mode (not timed against the peers): ours last.
    assert_eq!(
        order(
            &d.decide_problem(&dense(256).with_mask(Mask::CausalBottomRight).with_grad())
                .unwrap()
                .bwd
        ),
        ["torch-cudnn", "generated", "torch-flash"]
    );
    assert_eq!(
        order(&d.decide_problem(&p.with_deterministic()).unwrap().bwd),
        ["torch-cudnn", "torch-flash", "generated"]
    );
    // Long keys on Hopper: ours first in the forward (measured >= 1.02x
    // cuDNN from 2k), cuDNN still first in the backward; not on sm80.
    let mut long = p;
    long.seqlen_q = LONG_KEYS;
    long.seqlen_k = LONG_KEYS;
    let dec = d.decide_problem(&long).unwrap();
    assert_eq!(order(&dec.fwd), ["generated", "torch-cudnn", "torch-flash"]);
    assert_eq!(dec.fwd.chosen().unwrap().name(), "generated");
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-cudnn");
    let mut long80 = long;
    long80.cc = SM80;
    assert_eq!(
        d.decide_problem(&long80).unwrap().fwd.chosen().unwrap().name(),
        "torch-cudnn"
    );
    // Where ours declines (dropout), the next one takes it.
    let dec = d.decide_problem(&long.with_dropout(0.1)).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-flash");
    // A policy picks ours, per direction, with the spec it would run.
    d.set_policy(Policy::auto().with_fwd("generated").with_bwd("generated"));
    let dec = d.decide_problem(&p).unwrap();
    let f = dec.fwd.chosen().unwrap();
    assert_eq!(f.spec().unwrap().to_string(), "fwd.bf16.d128.causal-br.dense.sm90a");
    let b = dec.bwd.chosen().unwrap();
    assert_eq!(b.spec().unwrap().to_string(), "bwd.bf16.d128.causal-br.dense.sm90a");
    // Mixed: ours forward, torch's backward.
    d.set_policy(Policy::auto().with_fwd("generated").with_bwd("torch-flash"));
    let dec = d.decide_problem(&p).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "generated");
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-flash");
}

#[test]
fn arbitrary_attn_mask_routes_to_cudnn() {
    let d = torch(Policy::auto());
    let dec = d.decide_problem(&dense(128).with_attn_mask().with_grad()).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-cudnn");
    assert_eq!(
        rejected_reason(&dec.fwd, "generated"),
        "arbitrary attn_mask unsupported"
    );
    assert_eq!(
        rejected_reason(&dec.fwd, "torch-flash"),
        "arbitrary attn_mask unsupported"
    );
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-cudnn");
    // d=256 with a mask on sm80: cuDNN's limit is 128 there, so nothing is left.
    let mut p = dense(256).with_attn_mask();
    p.cc = SM80;
    let e = d.decide_problem(&p).unwrap().fwd.chosen().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DispatchError::NoBackend { .. }), "{e:?}");
    assert!(msg.contains("torch-cudnn: head dim 256 > 128"), "{msg}");
}

#[test]
fn dropout_routes_both_directions_to_torch_flash() {
    let d = torch(Policy::auto());
    let dec = d.decide_problem(&dense(64).with_dropout(0.1).with_grad()).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-flash");
    assert_eq!(rejected_reason(&dec.fwd, "generated"), "dropout unsupported");
    assert_eq!(rejected_reason(&dec.fwd, "torch-cudnn"), "dropout unsupported");
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-flash");
}

#[test]
fn dropout_rng_must_be_replayed_by_its_producer() {
    // A second dropout-capable backend may not consume torch-flash's RNG.
    const OTHER: DirectBackend = DirectBackend::new("other-flash", direct::TORCH_FLASH_CAPS, LseKind::Packed);
    let d = torch(Policy::auto().with_bwd("other-flash"));
    d.register(Arc::new(OTHER)).unwrap();
    let dec = d.decide_problem(&dense(64).with_dropout(0.1).with_grad()).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-flash");
    let e = dec.bwd.chosen().unwrap_err();
    assert!(matches!(e, DispatchError::PolicyDeclined { .. }), "{e:?}");
    assert!(e.to_string().contains("only `torch-flash` can replay it"), "{e}");
    // Without dropout the same backend is fine.
    let dec = d.decide_problem(&dense(64).with_grad()).unwrap();
    assert_eq!(dec.bwd.chosen().unwrap().name(), "other-flash");
}

#[test]
fn env_policy_overrides_the_ranking() {
    let env = |k: &str| match k {
        "ATTNFORGE_BACKEND_FWD" => Some("torch-cudnn,torch-flash".to_string()),
        "ATTNFORGE_BACKEND_BWD" => Some("torch-cudnn".to_string()),
        _ => None,
    };
    let d = torch(Policy::from_vars(env));
    let dec = d.decide_problem(&dense(128).with_grad()).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-cudnn");
    assert_eq!(order(&dec.fwd), ["torch-cudnn", "torch-flash", "generated"]);
    assert_eq!(rejected_reason(&dec.fwd, "generated"), "not in ATTNFORGE_BACKEND_FWD");
    assert_eq!(dec.fwd.ranked[1].verdict, Verdict::Eligible);
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-cudnn");
    // The env list's order is the preference order.
    d.set_policy(Policy::auto().with_fwd("torch-flash,torch-cudnn"));
    assert_eq!(d.chosen_name(&dense(128), Direction::Fwd).unwrap(), "torch-flash");
}

#[test]
fn a_policy_naming_a_declining_backend_explains_why() {
    let d = torch(Policy::auto().with_fwd("generated"));
    let e = d
        .decide_problem(&dense(128).with_attn_mask())
        .unwrap()
        .fwd
        .chosen()
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DispatchError::PolicyDeclined { .. }), "{e:?}");
    assert!(
        msg.contains("policy=generated") && msg.contains("generated: arbitrary attn_mask unsupported"),
        "{msg}"
    );
    // Backward: generated is named but declines the dropout problem.
    d.set_policy(Policy::auto().with_bwd("generated"));
    let e = d
        .decide_problem(&dense(128).with_grad().with_dropout(0.1))
        .unwrap()
        .bwd
        .chosen()
        .unwrap_err();
    assert!(e.to_string().contains("generated: dropout unsupported"), "{e}");
}

#[test]
fn unknown_policy_names_are_errors_listing_the_registry() {
    let d = torch(Policy::from_vars(|k| {
        (k == "ATTNFORGE_BACKEND_FWD").then(|| "generated,flash3".to_string())
    }));
    let e = d.decide_problem(&dense(128)).unwrap().fwd.chosen().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DispatchError::UnknownBackend { .. }), "{e:?}");
    assert!(
        msg.contains("ATTNFORGE_BACKEND_FWD") && msg.contains("`flash3`") && msg.contains("torch-cudnn"),
        "{msg}"
    );
    // Without the torch descriptors (a JAX process), torch-flash is unknown too.
    let jax = Dispatcher::with_generated(Policy::auto().with_bwd("torch-flash"));
    let e = jax.decide_problem(&dense(64)).unwrap().bwd.chosen().unwrap_err();
    assert!(e.to_string().contains("registered: generated"), "{e}");
}

#[test]
fn planner_refusals_become_decline_reasons_and_nothing_left_is_an_error() {
    let d = torch(Policy::auto());
    let dec = d.decide_problem(&dense(100)).unwrap();
    let gen = rejected_reason(&dec.fwd, "generated");
    assert!(gen.contains("head_dim_qk") && gen.contains("multiples of 8"), "{gen}");
    let e = dec.fwd.chosen().unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("no fwd backend supports this problem"), "{msg}");
    assert!(
        msg.contains("torch-flash: head dim 100 is not a multiple of 8"),
        "{msg}"
    );
    // f32: nobody.
    let mut p = dense(64);
    p.dtype = ElemType::F32;
    let e = d.decide_problem(&p).unwrap().fwd.chosen().unwrap_err();
    assert!(e.to_string().contains("dtype f32 unsupported"), "{e}");
}

#[test]
fn deterministic_backward_skips_cudnn() {
    let d = torch(Policy::auto().with_bwd("torch-cudnn,torch-flash"));
    let dec = d.decide_problem(&dense(128).with_grad().with_deterministic()).unwrap();
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-flash");
    assert_eq!(
        rejected_reason(&dec.bwd, "torch-cudnn"),
        "deterministic backward unsupported"
    );
    // By default FA2's deterministic backward takes it (cuDNN declines);
    // ours runs its deterministic kernel when asked.
    d.set_policy(Policy::auto());
    let dec = d.decide_problem(&dense(128).with_grad().with_deterministic()).unwrap();
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-flash");
    d.set_policy(Policy::auto().with_fwd("generated").with_bwd("generated"));
    let dec = d.decide_problem(&dense(128).with_grad().with_deterministic()).unwrap();
    let b = dec.bwd.chosen().unwrap();
    assert_eq!(b.name(), "generated");
    assert_eq!(b.spec().unwrap().to_string(), "bwd.bf16.d128.none.dense.det.sm90a");
    assert_eq!(
        dec.fwd.chosen().unwrap().spec().unwrap().to_string(),
        "fwd.bf16.d128.none.dense.sm90a"
    );
}

#[test]
fn softcap_stays_on_generated_and_non_square_top_left_skips_flash() {
    let d = torch(Policy::auto());
    let mut p = dense(128).with_mask(Mask::CausalTopLeft).with_grad();
    p.seqlen_q = 100;
    let dec = d.decide_problem(&p).unwrap();
    // cuDNN's causal is top-left, so it takes both directions; flash declines.
    assert_eq!(dec.fwd.chosen().unwrap().name(), "torch-cudnn");
    assert!(rejected_reason(&dec.bwd, "torch-flash").contains("top-left"));
    assert_eq!(dec.bwd.chosen().unwrap().name(), "torch-cudnn");
    d.set_policy(Policy::auto().with_bwd("torch-flash,generated"));
    let dec = d.decide_problem(&p).unwrap();
    assert_eq!(dec.bwd.chosen().unwrap().name(), "generated");
    d.set_policy(Policy::auto());
    let dec = d.decide_problem(&dense(128).with_softcap(30.0).with_grad()).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "generated");
    let b = dec.bwd.chosen().unwrap();
    assert_eq!(b.name(), "generated", "only the generated backward does softcap");
    assert_eq!(b.spec().unwrap().to_string(), "bwd.bf16.d128.none.dense.softcap.sm90a");
    assert_eq!(rejected_reason(&dec.bwd, "torch-flash"), "softcap unsupported");
}

#[test]
fn decisions_are_memoized_per_key_and_logged_once() {
    let d = torch(Policy::auto().with_debug(true));
    let a = dense(128).with_grad();
    let mut b = a;
    b.seqlen_q = 17;
    b.batch = 9; // same key
    let first = d.decide_problem(&a).unwrap();
    let second = d.decide_problem(&b).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    d.decide_problem(&a.with_dropout(0.1)).unwrap();
    d.decide_problem(&a.with_dropout(0.1)).unwrap();
    let log = d.captured_log();
    assert_eq!(log.len(), 2, "{log:#?}");
    assert!(log[0].contains("fwd=torch-cudnn | bwd=torch-cudnn"), "{}", log[0]);
    assert!(
        log[1].contains("fwd=torch-flash [torch-cudnn: dropout unsupported"),
        "{}",
        log[1]
    );
    assert_eq!(d.memo_len(), 2);
    d.set_policy(Policy::auto());
    assert_eq!(d.memo_len(), 0);
    // Debug off: nothing more.
    d.decide_problem(&a).unwrap();
    assert_eq!(d.captured_log().len(), 2);
}

#[test]
fn invalid_problems_never_reach_a_backend() {
    let d = torch(Policy::auto());
    let mut p = dense(128);
    p.heads_kv = 5;
    assert!(matches!(d.decide_problem(&p), Err(DispatchError::Problem(_))));
    assert_eq!(d.memo_len(), 0);
}

#[test]
fn duplicate_registration_is_refused() {
    let d = torch(Policy::auto());
    let e = d.register(Arc::new(DirectBackend::torch_flash())).unwrap_err();
    assert_eq!(e, DispatchError::DuplicateBackend { name: "torch-flash" });
}

fn thd_call(problem: Problem) -> FwdCall {
    let t = TensorArg::thd(0x10000, problem.heads_q as i64, problem.head_dim_qk as i64);
    let mut c = FwdCall::new(problem, t, t, t, t, 0x90000);
    c.cu_seqlens_q = Some(0x1000);
    c.cu_seqlens_k = Some(0x1000);
    c
}

#[test]
fn generated_forward_context_feeds_either_backward() {
    // Ragged self-attention: 4 sequences (one empty), total 8 tokens.
    let cu = [0, 2, 2, 7, 8];
    let p = Problem::thd(ElemType::Bf16, 128, 4, 3, 1, (5, 8), (5, 8), SM90)
        .with_mask(Mask::CausalTopLeft)
        .with_thd_equal_seqlens(true)
        .with_grad();
    let d = torch(Policy::auto().with_fwd("generated").with_bwd("generated"));
    let dec = d.decide_problem(&p).unwrap();
    assert_eq!(dec.fwd.chosen().unwrap().name(), "generated");
    assert_eq!(dec.bwd.chosen().unwrap().name(), "generated");
    assert_eq!(dec.lse_handoff(), Some((LseKind::Packed, LseKind::Packed)));
    d.set_policy(Policy::auto().with_bwd("torch-flash"));

    let gen = d.backend("generated").unwrap();
    let ctx = FwdContext::new(gen.as_ref(), &thd_call(p)).unwrap();
    assert_eq!(ctx.producer, "generated");
    assert_eq!(ctx.lse_layout, LseLayout::Packed { heads: 3, total_q: 8 });
    assert!((ctx.scale - 1.0 / 128f32.sqrt()).abs() < 1e-7);
    assert_eq!(ctx.mask.bottom_right_window(p.square()), Some((-1, 0)));
    assert_eq!(ctx.cu_seqlens_q, Some(0x1000));

    // Today's torch: packed varlen LSE, nothing to convert.
    let (chosen, conv) = d.bwd_route(&ctx).unwrap();
    assert_eq!(chosen.name(), "torch-flash");
    assert!(conv.is_identity());
    // Running it from Rust is the front end's job.
    let bwd_call = BwdCall {
        d_o: TensorArg::default(),
        q: TensorArg::default(),
        k: TensorArg::default(),
        v: TensorArg::default(),
        o: TensorArg::default(),
        dq: TensorArg::default(),
        dk: TensorArg::default(),
        dv: TensorArg::default(),
        attn_bias: None,
        workspace: Workspace::default(),
        stream: 0,
    };
    assert_eq!(
        d.bwd(&bwd_call, &ctx),
        Err(DispatchError::ExecutedByFrontEnd {
            backend: "torch-flash",
            direction: Direction::Bwd
        })
    );

    // A torch whose varlen flash reads a padded [B, H, max_seqlen_q] LSE.
    let old = torch_with_padded_flash();
    old.set_policy(Policy::auto().with_bwd("generated"));
    let (chosen, conv) = old.bwd_route(&ctx).unwrap();
    assert_eq!(chosen.name(), "generated", "ours: packed, nothing to convert");
    assert!(conv.is_identity());
    old.set_policy(Policy::auto().with_bwd("torch-flash"));
    let (_, conv) = old.bwd_route(&ctx).unwrap();
    assert_eq!(
        conv.to,
        LseLayout::Padded {
            batch: 4,
            heads: 3,
            max_seqlen_q: 5
        }
    );
    let src: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let padded = conv.apply_host(&src, &cu).unwrap();
    // head 2, sequence 2 (tokens 2..7), row 3 = packed element 2*8 + 2 + 3.
    assert_eq!(padded[(2 * 3 + 2) * 5 + 3], src[2 * 8 + 5]);
    assert_eq!(padded[(3 * 3 + 1) * 5 + 1], f32::INFINITY, "sequence 3 has one row");
    assert!(conv.describe().contains("packed [3, 8] -> padded [4, 3, 5]"));
}

fn torch_with_padded_flash() -> Dispatcher {
    let d = Dispatcher::capturing(Policy::auto());
    d.register(Arc::new(GeneratedBackend::global())).unwrap();
    d.register(Arc::new(DirectBackend::torch_flash().with_thd_lse(LseKind::Padded)))
        .unwrap();
    d
}

#[test]
fn direct_forward_is_executed_by_the_front_end() {
    let d = torch(Policy::auto());
    let p = dense(128).with_attn_mask();
    let t = TensorArg::bshd(0x1000, 1024, 16, 128);
    let e = d.fwd(&FwdCall::new(p, t, t, t, t, 0x2000)).unwrap_err();
    assert_eq!(
        e,
        DispatchError::ExecutedByFrontEnd {
            backend: "torch-cudnn",
            direction: Direction::Fwd
        }
    );
    // The front end builds the context itself; cuDNN's dense LSE is ours.
    let cudnn = d.backend("torch-cudnn").unwrap();
    let ctx = FwdContext::new(cudnn.as_ref(), &FwdCall::new(p, t, t, t, t, 0x2000)).unwrap();
    assert_eq!(
        ctx.lse_layout,
        LseLayout::Dense {
            batch: 2,
            heads: 16,
            seqlen_q: 1024
        }
    );
}

/// A stand-in for the future cuDNN graph backend: a Native backend slots in
/// through `register` with no change to the interface.
#[derive(Debug)]
struct FakeGraph;

impl Backend for FakeGraph {
    fn name(&self) -> &'static str {
        "cudnn-graph"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }
    fn supports(&self, direction: Direction, key: &ProblemKey) -> Result<Support, String> {
        direct::TORCH_CUDNN_CAPS.check(key, direction).map(|()| Support {
            spec: None,
            note: Some("graph cached".into()),
        })
    }
    fn call_fwd(&self, call: &FwdCall, _s: &Support) -> Result<FwdContext, DispatchError> {
        Ok(FwdContext::new(self, call)?)
    }
}

#[test]
fn a_native_backend_slots_in_after_the_ranking_table() {
    let d = torch(Policy::auto());
    d.register(Arc::new(FakeGraph)).unwrap();
    let p = dense(128).with_attn_mask();
    let dec = d.decide_problem(&p).unwrap();
    assert_eq!(
        order(&dec.fwd),
        ["torch-cudnn", "generated", "torch-flash", "cudnn-graph"]
    );
    d.set_policy(Policy::auto().with_fwd("cudnn-graph"));
    let t = TensorArg::bshd(0x1000, 2048, 16, 128);
    let ctx = d.fwd(&FwdCall::new(p, t, t, t, t, 0x2000)).unwrap();
    assert_eq!(ctx.producer, "cudnn-graph");
    assert!(d.explain(&p).unwrap().contains("[graph cached]"));
}

#[test]
fn explain_lists_every_candidate_with_its_reason() {
    let d = torch(Policy::auto());
    let p = Problem::thd(ElemType::F16, 128, 3, 8, 2, (900, 2000), (900, 2000), SM80).with_dropout(0.1);
    let text = d.explain(&p).unwrap();
    for want in [
        "forward   -> torch-flash",
        "1. torch-cudnn  rejected: ragged THD layout unsupported",
        "2. torch-flash  chosen",
        "3. generated    rejected: dropout unsupported",
        "backward  -> torch-flash",
        "(not needed: requires_grad is off)",
        "context   LSE packed [H, total_q], consumed as is",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let text = d.explain(&dense(64).with_softcap(10.0).with_grad()).unwrap();
    assert!(text.contains("spec fwd.bf16.d64.none.dense.softcap.sm90a"), "{text}");
    assert!(text.contains("[template fwd_sm90a.cu"), "{text}");
}

#[test]
fn generated_backward_runs_through_the_dispatcher_after_any_dense_forward() {
    let d = torch(Policy::auto().with_bwd("generated"));
    let p = dense(64).with_mask(Mask::CausalBottomRight).with_grad();
    let t = TensorArg::bshd(0x10000, 2048, 16, 64);
    let gen = d.backend("generated").unwrap();
    let ws = gen.workspace_bytes(Direction::Bwd, &p);
    assert!(ws >= 4 * 2 * 16 * 2048, "{ws}");
    let mut call = BwdCall {
        d_o: t,
        q: t,
        k: t,
        v: t,
        o: t,
        dq: t,
        dk: t,
        dv: TensorArg { ptr: 0x10008, ..t },
        attn_bias: None,
        workspace: Workspace {
            ptr: 0x800_0000,
            bytes: ws,
        },
        stream: 0,
    };
    // Contexts from our forward and from torch's cuDNN forward (dense LSE)
    // both reach the generated backward's argument check (no GPU needed).
    for producer in ["generated", "torch-cudnn", "torch-flash"] {
        let b = d.backend(producer).unwrap();
        let ctx = FwdContext::new(b.as_ref(), &FwdCall::new(p, t, t, t, t, 0x20000)).unwrap();
        let e = d.bwd(&call, &ctx).unwrap_err();
        assert!(e.to_string().contains("`dv`"), "{producer}: {e}");
    }
    call.dv = t;
    call.workspace.bytes = ws - 16;
    let ctx = FwdContext::new(gen.as_ref(), &FwdCall::new(p, t, t, t, t, 0x20000)).unwrap();
    let e = d.bwd(&call, &ctx).unwrap_err();
    assert!(e.to_string().contains("workspace"), "{e}");
}

#[test]
fn a_ragged_batch_picks_its_variant_by_its_longest_keys() {
    use crate::plan::Variant;
    // d 80..128 without a mask: the main plan at every length (session 48);
    // d256 causal and d64 causal keep their short-keys tiles.
    for (d, mask, max_k, want) in [
        (128, Mask::None, 512, Variant::Main),
        (96, Mask::None, 1024, Variant::Main),
        (64, Mask::None, 512, Variant::Main),
        (256, Mask::CausalBottomRight, 1024, Variant::ShortKeys),
        (256, Mask::CausalBottomRight, 1025, Variant::Main),
        (64, Mask::CausalBottomRight, 512, Variant::ShortKeys),
    ] {
        let p = Problem::thd(ElemType::Bf16, d, 8, 16, 16, (max_k, 4000), (max_k, 4000), SM90).with_mask(mask);
        let spec = p.key().spec(Direction::Fwd).unwrap();
        assert_eq!(
            GeneratedBackend::global().fwd_variant(&thd_call(p), &spec),
            want,
            "{spec} max keys {max_k}"
        );
    }
}

#[test]
fn the_keys_length_picks_the_short_or_mid_keys_variant_where_the_spec_has_one() {
    use crate::plan::Variant;
    for (d, mask, s, want) in [
        (64, Mask::CausalBottomRight, 512, Variant::ShortKeys),
        (128, Mask::CausalBottomRight, 1024, Variant::ShortKeys),
        (128, Mask::CausalBottomRight, 1025, Variant::Main),
        (64, Mask::CausalBottomRight, 2048, Variant::Main),
        (64, Mask::None, 512, Variant::ShortKeys),
        (64, Mask::None, 1025, Variant::Main),
        (256, Mask::CausalBottomRight, 512, Variant::ShortKeys),
        (256, Mask::None, 512, Variant::Main),
        (128, Mask::None, 512, Variant::ShortKeys),
        (128, Mask::None, 1024, Variant::ShortKeys),
        (128, Mask::None, 1025, Variant::Main),
        (256, Mask::CausalBottomRight, 2048, Variant::ShortKeys),
        (256, Mask::CausalBottomRight, 2049, Variant::Main),
        (128, Mask::CausalBottomRight, 2048, Variant::Main),
    ] {
        let mut p = Problem::dense(ElemType::Bf16, d, 2, 16, 16, s, s, SM90);
        p.mask = mask;
        let spec = p.key().spec(Direction::Fwd).unwrap();
        let t = TensorArg::bshd(0x10000, s as i64, 16, d as i64);
        let call = FwdCall::new(p, t, t, t, t, 0x90000);
        assert_eq!(
            GeneratedBackend::global().fwd_variant(&call, &spec),
            want,
            "{spec} s={s}"
        );
    }
}

#[test]
fn the_policy_s_sm80_path_moves_every_generated_kernel_to_the_sm80_templates() {
    use crate::plan::Variant;
    let d = torch(Policy::auto().with_generated_path(GeneratedPath::Sm80));
    let gen = d.backend("generated").unwrap();
    for (d_head, mask, s) in [(128, Mask::None, 2048), (64, Mask::CausalBottomRight, 512)] {
        let p = Problem::dense(ElemType::Bf16, d_head, 2, 16, 16, s, s, SM90)
            .with_mask(mask)
            .with_grad();
        let dec = d.decide_problem(&p).unwrap();
        for (side, template) in [(&dec.fwd, "fwd_sm80.cu"), (&dec.bwd, "bwd_sm80.cu")] {
            let note = generated_note(side);
            assert!(note.contains(template), "{note}");
        }
        let spec = p.key().spec(Direction::Fwd).unwrap();
        let t = TensorArg::bshd(0x10000, s as i64, 16, d_head as i64);
        let call = FwdCall::new(p, t, t, t, t, 0x90000);
        let b = GeneratedBackend::global();
        b.apply_policy(&d.policy());
        assert_eq!(b.fwd_variant(&call, &spec), Variant::Sm80Path);
        assert_eq!(b.bwd_variant(), Variant::Sm80Path);
        // The sm80 backward's workspace (dQ accumulator in 8-row tiles), not
        // the wgmma backward's.
        let bwd_spec = p.key().spec(Direction::Bwd).unwrap();
        let sm80 = crate::plan::plan_sm80_path(&bwd_spec).unwrap();
        let fp = crate::launch::FwdProblem {
            batch: 2,
            heads_q: 16,
            seqlen_q: s,
            total_q: 0,
            ..Default::default()
        };
        let want = generated::BwdWorkspace::new(&sm80, &fp, 2 * 16 * s as usize).total();
        assert_eq!(gen.workspace_bytes(Direction::Bwd, &p) as u64, want);
    }
    // Back to the planner: the wgmma templates again, decided afresh.
    d.set_policy(Policy::auto());
    let dec = d.decide_problem(&dense(128)).unwrap();
    assert!(generated_note(&dec.fwd).contains("fwd_sm90a.cu"));
    // A value that names no path: the generated backend declines, and says why.
    d.set_policy(Policy::auto().with_generated_path(GeneratedPath::parse("sm75")));
    let dec = d.decide_problem(&dense(128)).unwrap();
    assert!(rejected_reason(&dec.fwd, "generated").contains("`sm75`"));
    assert_ne!(dec.fwd.chosen().unwrap().name(), "generated");
}

#[test]
fn the_generated_note_names_the_tiles_a_call_takes_by_its_keys() {
    // The key holds no length, so the note gives the main plan's tiles and
    // each variant's with the keys that take it.
    let d = torch(Policy::auto());
    let p = Problem::dense(ElemType::Bf16, 64, 2, 16, 16, 4096, 4096, SM90).with_mask(Mask::CausalTopLeft);
    let dec = d.decide_problem(&p).unwrap();
    let note = generated_note(&dec.fwd);
    let spec = p.key().spec(Direction::Fwd).unwrap();
    let main = crate::plan::plan(&spec).unwrap();
    assert!(
        note.starts_with(&format!(
            "template fwd_sm90a.cu, block_m={} block_n={}",
            main.block_m, main.block_n
        )),
        "{note}"
    );
    let short = crate::plan::plan_variant(&spec, crate::plan::Variant::ShortKeys)
        .unwrap()
        .unwrap();
    let short_keys = crate::plan::Variant::ShortKeys.keys(&spec).unwrap();
    assert!(
        note.contains(&format!(
            "calls of up to {} keys: block_m={} block_n={}",
            short_keys.end(),
            short.block_m,
            short.block_n
        )),
        "{note}"
    );
    let mid_keys = crate::plan::Variant::MidKeys.keys(&spec).unwrap();
    assert!(
        note.contains(&format!("calls of {}..={} keys", mid_keys.start(), mid_keys.end())),
        "{note}"
    );
    // Without a variant (d256 without a mask on dense tensors: none), the main tiles alone.
    let p = Problem::dense(ElemType::Bf16, 256, 2, 8, 8, 4096, 4096, SM90);
    let spec = p.key().spec(Direction::Fwd).unwrap();
    let dec = d.decide_problem(&p).unwrap();
    let note = generated_note(&dec.fwd);
    assert_eq!(
        note.contains("calls of"),
        crate::plan::variants(&spec).count() > 1,
        "{note}"
    );
}
