//! The decision: from (problem key, registered backends, policy) to a ranked
//! list per direction, each rejection with a one-line reason. Pure.
//!
//! Rules, as tables:
//! - [`DEFAULT_RANKING`]: the preference order per direction when no policy
//!   is set; registered backends it does not name follow, in registration
//!   order.
//! - A policy list replaces the order; backends it does not name are
//!   rejected with "not in `<origin>`"; a name that is not registered is an
//!   error; if every named backend declines, that is an error that lists why.
//! - Each candidate's own [`Backend::supports`] (capability data + rules).
//! - [`CONTEXT_RULES`]: between the forward's producer and a backward
//!   candidate (dropout RNG replay).
//!
//! The forward and the backward are chosen independently; the backward only
//! sees which backend produced the forward context.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::spec::{AttnSpec, Direction};

use super::backend::{Backend, BackendKind, Support};
use super::context::{rng_rule, LseKind};
use super::direct::{TORCH_CUDNN, TORCH_FLASH};
use super::error::{DispatchError, Rejection};
use super::generated::GENERATED;
use super::policy::{Policy, PolicyList};
use super::problem::ProblemKey;

/// Default preference per direction, device generation and (where a row says
/// so) problem, fastest first as measured on the H200 (bf16, same-run
/// `make gpu-bench`, docs/benchmarks/2026-12-03-s6-bench.md): cuDNN ahead of
/// FlashAttention-2 in both directions. On Hopper our forward is the
/// wgmma/TMA kernel, 1.5-2.8x the FA2 forward; against cuDNN's, timed in
/// interleaved rounds in one process, 1.02-1.19x at every 2k cell (d64, d128,
/// d256, causal and not) and 1.11-1.31x from 8k on an H100
/// (docs/benchmarks/2026-12-07-s47-interleaved.md), 1.03-1.13x at 2k on the
/// H200 (docs/benchmarks/2026-12-06-s37-interleaved.md), 0.96-1.02x at 512
/// keys; ragged batches 1.08-1.18x against cuDNN's ragged graph
/// (docs/benchmarks/2026-12-07-s47-bench.md): it ranks first for long keys
/// (>= 2048, [`ProblemKey::long_keys`], the key's one size class; 8192 until
/// session 49, from session 10's figures) and between cuDNN and FA2 otherwise; elsewhere the forward is the sm80
/// path (0.8-1.06x FA2) and ranks last. Our fast-mode backward ranks between
/// cuDNN and FA2 on Hopper (H100, docs/benchmarks/2026-12-06-s31-bench.md,
/// with the tiled dQ accumulator): the wgmma backward 1.04-1.40x FA2 at d64/d128
/// (0.64-0.84x cuDNN), and the sm80 path, which takes d256 and what the wgmma
/// backward declines, 1.06-1.20x FA2 at d256 and 1.01-1.33x at d64/d128 at
/// every seqlen from 512. It ranks last in deterministic mode (not timed
/// against the peers) and on other generations (measured on no device here).
/// Ours still take what the others decline (softcap, sliding windows,
/// bottom-right causal with seqlen_q != seqlen_k, deterministic backward,
/// ...) and everything where no front end registers direct backends (Rust
/// callers, the C ABI). The first row that applies wins. Revisit with each
/// new figure.
pub const DEFAULT_RANKING: &[RankRow] = &[
    RankRow {
        direction: Direction::Fwd,
        min_major: 9,
        when: long_keys_on_hopper,
        order: &[GENERATED, TORCH_CUDNN, TORCH_FLASH],
    },
    RankRow {
        direction: Direction::Fwd,
        min_major: 9,
        when: always,
        order: &[TORCH_CUDNN, GENERATED, TORCH_FLASH],
    },
    RankRow {
        direction: Direction::Fwd,
        min_major: 0,
        when: always,
        order: &[TORCH_CUDNN, TORCH_FLASH, GENERATED],
    },
    RankRow {
        direction: Direction::Bwd,
        min_major: 9,
        when: fast_backward_on_hopper,
        order: &[TORCH_CUDNN, GENERATED, TORCH_FLASH],
    },
    RankRow {
        direction: Direction::Bwd,
        min_major: 0,
        when: always,
        order: &[TORCH_CUDNN, TORCH_FLASH, GENERATED],
    },
];

/// One row of [`DEFAULT_RANKING`]: applies to `direction` on devices of
/// compute capability major >= `min_major` for the problems where `when`
/// holds (a pure function of the problem key, so a decision cached by key
/// stays right).
#[derive(Debug, Clone, Copy)]
pub struct RankRow {
    pub direction: Direction,
    pub min_major: u8,
    pub when: fn(&ProblemKey) -> bool,
    pub order: &'static [&'static str],
}

fn always(_: &ProblemKey) -> bool {
    true
}

/// Keys >= [`super::problem::LONG_KEYS`] on a Hopper GPU (sm90a: the wgmma
/// forward; other generations run other kernels, measured on no device here).
fn long_keys_on_hopper(key: &ProblemKey) -> bool {
    key.long_keys && key.cc.major == 9
}

/// A fast-mode (not deterministic) backward on a Hopper GPU, where both of
/// our backward templates were measured ahead of FlashAttention-2.
fn fast_backward_on_hopper(key: &ProblemKey) -> bool {
    !key.deterministic && key.cc.major == 9
}

type Backends = Vec<Arc<dyn Backend>>;

type ContextRule = fn(&ProblemKey, &str, &str) -> Option<String>;

/// Rules between the forward's producer and a backward candidate:
/// (name, check(key, producer, candidate) → reason).
pub const CONTEXT_RULES: &[(&str, ContextRule)] = &[("dropout-rng", |k, producer, consumer| {
    rng_rule(k.dropout, producer, consumer)
})];

/// What happened to one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Chosen,
    /// Supports the problem, ranked below the chosen one.
    Eligible,
    /// Declines, with its reason.
    Rejected(String),
}

/// One row of the ranked list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    pub backend: &'static str,
    pub kind: BackendKind,
    pub verdict: Verdict,
    pub support: Option<Support>,
}

/// The chosen backend of one direction.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub backend: Arc<dyn Backend>,
    pub support: Support,
}

impl Chosen {
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }
    pub fn spec(&self) -> Option<AttnSpec> {
        self.support.spec
    }
}

/// One direction's decision.
#[derive(Debug, Clone)]
pub struct DirDecision {
    pub direction: Direction,
    /// Candidates in rank order.
    pub ranked: Vec<Ranked>,
    /// The policy list that ordered them, if any.
    pub policy: Option<PolicyList>,
    pub outcome: Result<Chosen, DispatchError>,
}

impl DirDecision {
    pub fn chosen(&self) -> Result<&Chosen, DispatchError> {
        self.outcome.as_ref().map_err(Clone::clone)
    }
}

/// Both directions for one problem key.
#[derive(Debug, Clone)]
pub struct Decision {
    pub key: ProblemKey,
    pub fwd: DirDecision,
    pub bwd: DirDecision,
}

fn default_order(direction: Direction, key: &ProblemKey, backends: &[Arc<dyn Backend>]) -> Vec<Arc<dyn Backend>> {
    let table: &[&str] = DEFAULT_RANKING
        .iter()
        .find(|r| r.direction == direction && key.cc.major >= r.min_major && (r.when)(key))
        .map(|r| r.order)
        .unwrap_or(&[]);
    let rank = |b: &Arc<dyn Backend>| table.iter().position(|n| *n == b.name()).unwrap_or(table.len());
    let mut order: Vec<Arc<dyn Backend>> = backends.to_vec();
    // Stable: backends outside the table keep registration order.
    order.sort_by_key(rank);
    order
}

/// Decide one direction. `producer`: the forward's chosen backend (backward only).
pub fn decide_direction(
    direction: Direction,
    key: &ProblemKey,
    backends: &[Arc<dyn Backend>],
    policy: Option<&PolicyList>,
    producer: Option<&'static str>,
) -> DirDecision {
    let mut ranked = Vec::new();
    let (order, excluded): (Backends, Backends) = match policy {
        None => (default_order(direction, key, backends), Vec::new()),
        Some(list) => {
            for name in &list.names {
                if !backends.iter().any(|b| b.name() == name) {
                    return DirDecision {
                        direction,
                        ranked,
                        policy: Some(list.clone()),
                        outcome: Err(DispatchError::UnknownBackend {
                            origin: list.origin.clone(),
                            name: name.clone(),
                            known: backends.iter().map(|b| b.name()).collect(),
                        }),
                    };
                }
            }
            let mut named: Vec<Arc<dyn Backend>> = backends
                .iter()
                .filter(|b| list.position(b.name()).is_some())
                .cloned()
                .collect();
            named.sort_by_key(|b| list.position(b.name()));
            let rest = backends
                .iter()
                .filter(|b| list.position(b.name()).is_none())
                .cloned()
                .collect();
            (named, rest)
        }
    };
    let mut chosen: Option<Chosen> = None;
    let mut rejections: Vec<Rejection> = Vec::new();
    for b in &order {
        let verdict = b.supports(direction, key).and_then(|s| {
            let ctx = producer.and_then(|p| CONTEXT_RULES.iter().find_map(|(_, rule)| rule(key, p, b.name())));
            match ctx {
                Some(reason) => Err(reason),
                None => Ok(s),
            }
        });
        let (verdict, support) = match verdict {
            Ok(s) if chosen.is_none() => {
                chosen = Some(Chosen {
                    backend: b.clone(),
                    support: s.clone(),
                });
                (Verdict::Chosen, Some(s))
            }
            Ok(s) => (Verdict::Eligible, Some(s)),
            Err(r) => {
                rejections.push((b.name(), r.clone()));
                (Verdict::Rejected(r), None)
            }
        };
        ranked.push(Ranked {
            backend: b.name(),
            kind: b.kind(),
            verdict,
            support,
        });
    }
    for b in &excluded {
        let origin = policy.map_or("policy", |l| l.origin.as_str());
        ranked.push(Ranked {
            backend: b.name(),
            kind: b.kind(),
            verdict: Verdict::Rejected(format!("not in {origin}")),
            support: None,
        });
    }
    let outcome = match (chosen, policy) {
        (Some(c), _) => Ok(c),
        (None, Some(list)) => Err(DispatchError::PolicyDeclined {
            direction,
            origin: list.origin.clone(),
            policy: list.to_string(),
            reasons: rejections,
        }),
        (None, None) => Err(DispatchError::NoBackend {
            direction,
            reasons: rejections,
        }),
    };
    DirDecision {
        direction,
        ranked,
        policy: policy.cloned(),
        outcome,
    }
}

/// Decide both directions for a key. Pure: same inputs, same decision.
pub fn decide(key: &ProblemKey, backends: &[Arc<dyn Backend>], policy: &Policy) -> Decision {
    let fwd = decide_direction(Direction::Fwd, key, backends, policy.fwd.as_ref(), None);
    let producer = fwd.outcome.as_ref().ok().map(Chosen::name);
    let bwd = decide_direction(Direction::Bwd, key, backends, policy.bwd.as_ref(), producer);
    Decision { key: *key, fwd, bwd }
}

impl Decision {
    /// The LSE layouts of the chosen forward and backward for this key's
    /// layout, when both are chosen: (produced, consumed).
    pub fn lse_handoff(&self) -> Option<(LseKind, LseKind)> {
        let f = self.fwd.outcome.as_ref().ok()?;
        let b = self.bwd.outcome.as_ref().ok()?;
        Some((f.backend.lse_kind(self.key.layout), b.backend.lse_kind(self.key.layout)))
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let side = |d: &DirDecision| match &d.outcome {
            Ok(c) => {
                let mut s = c.name().to_string();
                if let Some(spec) = c.spec() {
                    let _ = write!(s, " ({spec})");
                }
                let rejected: Vec<String> = d
                    .ranked
                    .iter()
                    .take_while(|r| r.verdict != Verdict::Chosen)
                    .filter_map(|r| match &r.verdict {
                        Verdict::Rejected(why) => Some(format!("{}: {why}", r.backend)),
                        _ => None,
                    })
                    .collect();
                if !rejected.is_empty() {
                    let _ = write!(s, " [{}]", rejected.join("; "));
                }
                s
            }
            Err(e) => format!("NONE ({e})"),
        };
        format!("{} -> fwd={} | bwd={}", self.key, side(&self.fwd), side(&self.bwd))
    }

    /// The multi-line explanation `attnforge explain` and `attnforge_explain` print.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "key       {}", self.key);
        for d in [&self.fwd, &self.bwd] {
            let title = match d.direction {
                Direction::Fwd => "forward ",
                Direction::Bwd => "backward",
            };
            let tail = if d.direction == Direction::Bwd && !self.key.requires_grad {
                "  (not needed: requires_grad is off)"
            } else {
                ""
            };
            match &d.outcome {
                Ok(c) => {
                    let _ = write!(out, "{title}  -> {}", c.name());
                    if let Some(spec) = c.spec() {
                        let _ = write!(out, "  spec {spec}");
                    }
                    let _ = writeln!(out, "{tail}");
                }
                Err(e) => {
                    let _ = writeln!(out, "{title}  -> none: {e}{tail}");
                }
            }
            if let Some(p) = &d.policy {
                let _ = writeln!(out, "  policy  {}={p}", p.origin);
            }
            for (i, r) in d.ranked.iter().enumerate() {
                let what = match &r.verdict {
                    Verdict::Chosen => "chosen".to_string(),
                    Verdict::Eligible => "eligible (ranked lower)".to_string(),
                    Verdict::Rejected(why) => format!("rejected: {why}"),
                };
                let _ = write!(out, "  {}. {:<12} {what}", i + 1, r.backend);
                if let Some(note) = r.support.as_ref().and_then(|s| s.note.as_ref()) {
                    let _ = write!(out, " [{note}]");
                }
                if r.kind == BackendKind::FrontEnd && r.verdict == Verdict::Chosen {
                    out.push_str(" (executed by the front end)");
                }
                out.push('\n');
            }
        }
        if let Some((from, to)) = self.lse_handoff() {
            if from == to {
                let _ = writeln!(out, "context   LSE {from}, consumed as is");
            } else {
                let _ = writeln!(
                    out,
                    "context   LSE {from} -> {to}: converted before the backward (context::LseConversion)"
                );
            }
        }
        out
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explain())
    }
}
