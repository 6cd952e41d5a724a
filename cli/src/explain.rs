//! `attnforge explain`: which backend the dispatcher picks for a problem, for
//! the forward and the backward, every candidate with the reason it was
//! rejected, and the generated kernel's spec. Pure decision logic: no GPU,
//! no NVRTC, no cache access.

use std::sync::Arc;

use attnforge::dispatch::{
    Backend, ComputeCapability, DirectBackend, Dispatcher, ElemType, GeneratedBackend, Policy, Problem,
};
use attnforge::{Layout, Mask};

/// Flags describing one attention problem.
#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// Element type: f16, bf16 or f32.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Head dim of Q and K (and V unless --head-dim-v).
    #[arg(long, default_value_t = 128)]
    pub head_dim: u32,
    /// Head dim of V and O when it differs from Q/K's (e.g. 128 with --head-dim 192).
    #[arg(long)]
    pub head_dim_v: Option<u32>,
    /// Batch size (THD: the number of sequences).
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Query heads.
    #[arg(long, default_value_t = 16)]
    pub heads: u32,
    /// Key/value heads (GQA/MQA); default: --heads.
    #[arg(long)]
    pub kv_heads: Option<u32>,
    /// Query length (THD: the maximum over the batch).
    #[arg(long, default_value_t = 4096)]
    pub seqlen_q: u32,
    /// Key length; default: --seqlen-q.
    #[arg(long)]
    pub seqlen_k: Option<u32>,
    /// Causal mask aligned at the top-left (default) or bottom-right corner.
    #[arg(long, num_args = 0..=1, default_missing_value = "top-left", value_name = "top-left|bottom-right",
          conflicts_with = "window")]
    pub causal: Option<String>,
    /// Sliding window `LEFT,RIGHT` around the bottom-right diagonal (-1 = unbounded).
    #[arg(long, value_name = "L,R", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Logit softcap: scores become X·tanh(s/X) before the softmax.
    #[arg(long, value_name = "X")]
    pub softcap: Option<f32>,
    /// Dropout probability on the attention weights (no generated kernel does dropout).
    #[arg(long, value_name = "P")]
    pub dropout: Option<f32>,
    /// An arbitrary attn_mask / additive bias is given.
    #[arg(long)]
    pub attn_mask: bool,
    /// dense or thd (ragged; all sequences assumed at the maximum length).
    #[arg(long, default_value = "dense")]
    pub layout: String,
    /// Device: sm80, sm86, sm89, sm90a, sm100, ... or a compute capability like 9.0.
    #[arg(long, default_value = "sm90a")]
    pub arch: String,
    /// A backward follows.
    #[arg(long)]
    pub requires_grad: bool,
    /// The backward must be bitwise repeatable.
    #[arg(long)]
    pub deterministic: bool,
    /// Registered backends (what is available), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "generated,torch-flash,torch-cudnn")]
    pub available: Vec<String>,
    /// Forward policy, as ATTNFORGE_BACKEND_FWD (overrides it).
    #[arg(long, value_name = "LIST")]
    pub backend_fwd: Option<String>,
    /// Backward policy, as ATTNFORGE_BACKEND_BWD (overrides it).
    #[arg(long, value_name = "LIST")]
    pub backend_bwd: Option<String>,
}

fn parse_window(s: &str) -> Result<(i32, i32), String> {
    let bad = || format!("--window `{s}`: expected LEFT,RIGHT with integers >= -1, e.g. 256,0");
    let (l, r) = s.split_once(',').ok_or_else(bad)?;
    Ok((
        l.trim().parse().map_err(|_| bad())?,
        r.trim().parse().map_err(|_| bad())?,
    ))
}

/// The problem the flags describe.
pub fn problem(a: &ExplainArgs) -> Result<Problem, String> {
    let dtype: ElemType = a
        .dtype
        .parse()
        .map_err(|e: attnforge::dispatch::ProblemError| e.to_string())?;
    let cc: ComputeCapability = a
        .arch
        .parse()
        .map_err(|e: attnforge::dispatch::ProblemError| e.to_string())?;
    let layout: Layout = a.layout.parse().map_err(|e: attnforge::SpecError| e.to_string())?;
    let kv = a.kv_heads.unwrap_or(a.heads);
    let sk = a.seqlen_k.unwrap_or(a.seqlen_q);
    let mut p = match layout {
        Layout::Dense => Problem::dense(dtype, a.head_dim, a.batch, a.heads, kv, a.seqlen_q, sk, cc),
        Layout::Thd => {
            let total = |s: u32| {
                a.batch
                    .checked_mul(s)
                    .ok_or_else(|| format!("--batch x seqlen ({} x {s}) overflows", a.batch))
            };
            Problem::thd(
                dtype,
                a.head_dim,
                a.batch,
                a.heads,
                kv,
                (a.seqlen_q, total(a.seqlen_q)?),
                (sk, total(sk)?),
                cc,
            )
            .with_thd_equal_seqlens(a.seqlen_q == sk)
        }
    };
    if let Some(v) = a.head_dim_v {
        p = p.with_head_dim_v(v);
    }
    if let Some(c) = &a.causal {
        p = p.with_mask(match c.as_str() {
            "top-left" | "tl" => Mask::CausalTopLeft,
            "bottom-right" | "br" => Mask::CausalBottomRight,
            other => return Err(format!("--causal `{other}`: expected top-left or bottom-right")),
        });
    }
    if let Some(w) = &a.window {
        let (l, r) = parse_window(w)?;
        p = p.with_window(l, r);
    }
    if let Some(c) = a.softcap {
        p = p.with_softcap(c);
    }
    if let Some(d) = a.dropout {
        p = p.with_dropout(d);
    }
    if a.attn_mask {
        p = p.with_attn_mask();
    }
    if a.requires_grad {
        p = p.with_grad();
    }
    if a.deterministic {
        p = p.with_deterministic();
    }
    p.validate().map_err(|e| e.to_string())?;
    Ok(p)
}

fn backend(name: &str) -> Result<Arc<dyn Backend>, String> {
    Ok(match name {
        "generated" => Arc::new(GeneratedBackend::global()),
        "torch-flash" => Arc::new(DirectBackend::torch_flash()),
        "torch-cudnn" => Arc::new(DirectBackend::torch_cudnn()),
        other => {
            return Err(format!(
                "--available: unknown backend `{other}` (known: generated, torch-flash, torch-cudnn)"
            ))
        }
    })
}

/// The dispatcher the flags describe: the available backends and the
/// environment's policy, overridden by --backend-fwd/--backend-bwd.
pub fn dispatcher(a: &ExplainArgs) -> Result<Dispatcher, String> {
    let mut policy = Policy::from_env();
    if let Some(f) = &a.backend_fwd {
        policy = policy.with_fwd(f);
    }
    if let Some(b) = &a.backend_bwd {
        policy = policy.with_bwd(b);
    }
    // The explanation is the output; no duplicate debug line.
    let d = Dispatcher::new(policy.with_debug(false));
    for name in a.available.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        d.register(backend(name)?).map_err(|e| e.to_string())?;
    }
    Ok(d)
}

/// Print the explanation; an error when no forward backend (or, with
/// --requires-grad, no backward backend) is left.
pub fn run(args: ExplainArgs) -> Result<(), String> {
    let p = problem(&args)?;
    let d = dispatcher(&args)?;
    let text = d.explain(&p).map_err(|e| e.to_string())?;
    println!("available {}", d.backend_names().join(", "));
    println!("policy    {}", d.policy());
    print!("{text}");
    let decision = d.decide_problem(&p).map_err(|e| e.to_string())?;
    decision.fwd.chosen().map_err(|e| e.to_string())?;
    if p.requires_grad {
        decision.bwd.chosen().map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ExplainArgs,
    }

    fn args(line: &str) -> ExplainArgs {
        Cli::try_parse_from(std::iter::once("explain").chain(line.split_whitespace()))
            .unwrap()
            .args
    }

    fn decide(line: &str) -> (String, String) {
        let a = args(line);
        let p = problem(&a).unwrap();
        let d = dispatcher(&a).unwrap();
        let dec = d.decide_problem(&p).unwrap();
        let name = |r: Result<&attnforge::dispatch::Chosen, _>| r.map(|c| c.name().to_string()).unwrap_or_default();
        (name(dec.fwd.chosen()), name(dec.bwd.chosen()))
    }

    #[test]
    fn flags_build_the_problem() {
        let a = args(
            "--dtype f16 --head-dim 192 --head-dim-v 128 --batch 3 --heads 32 --kv-heads 8 --seqlen-q 100 \
             --seqlen-k 900 --causal bottom-right --softcap 30 --layout thd --arch sm86 --requires-grad",
        );
        let p = problem(&a).unwrap();
        assert_eq!(
            p.to_string(),
            "f16 d192v128 thd b=3 hq=32 hkv=8 sq=100 sk=900 total_q=300 total_k=2700 causal-br softcap=30 grad sm86"
        );
        let p = problem(&args("--window -1,0")).unwrap();
        assert_eq!((p.mask, p.window), (Mask::SlidingWindow, (-1, 0)));
        assert_eq!(problem(&args("--causal")).unwrap().mask, Mask::CausalTopLeft);
        assert!(problem(&args("--window 5")).is_err());
        assert!(problem(&args("--dtype f8")).unwrap_err().contains("f16, bf16, f32"));
        assert!(problem(&args("--arch sm75x")).is_err());
        assert!(problem(&args("--heads 6 --kv-heads 4"))
            .unwrap_err()
            .contains("multiple"));
        assert!(Cli::try_parse_from(["x", "--causal", "--window", "1,0"]).is_err());
    }

    #[test]
    fn decisions_through_the_flags() {
        // Measured ranking: cuDNN first where it can (the forward from 2048
        // keys on Hopper: ours); ours where only we can.
        assert_eq!(
            decide("--requires-grad --seqlen-q 1024"),
            ("torch-cudnn".into(), "torch-cudnn".into())
        );
        assert_eq!(decide("--requires-grad"), ("generated".into(), "torch-cudnn".into()));
        assert_eq!(
            decide("--requires-grad --seqlen-q 4096 --seqlen-k 2047"),
            ("torch-cudnn".into(), "torch-cudnn".into())
        );
        assert_eq!(
            decide("--requires-grad --softcap 30"),
            ("generated".into(), "generated".into())
        );
        assert_eq!(decide("--attn-mask"), ("torch-cudnn".into(), "torch-cudnn".into()));
        assert_eq!(decide("--dropout 0.1"), ("torch-flash".into(), "torch-flash".into()));
        assert_eq!(
            decide("--available generated"),
            ("generated".into(), "generated".into())
        );
        assert_eq!(
            decide("--requires-grad --backend-fwd generated --backend-bwd torch-flash"),
            ("generated".into(), "torch-flash".into())
        );
        assert_eq!(
            decide("--backend-fwd torch-cudnn --backend-bwd torch-cudnn"),
            ("torch-cudnn".into(), "torch-cudnn".into())
        );
        assert!(dispatcher(&args("--available generated,flash9"))
            .unwrap_err()
            .contains("flash9"));
    }

    #[test]
    fn run_fails_when_nothing_is_left() {
        assert!(run(args("--arch sm80 --head-dim 256 --attn-mask")).is_err());
        assert!(
            run(args("--softcap 30 --requires-grad")).is_ok(),
            "the generated backward does softcap"
        );
        assert!(
            run(args(
                "--softcap 30 --requires-grad --backend-bwd torch-flash,torch-cudnn"
            ))
            .is_err(),
            "no torch backward does softcap"
        );
        assert!(run(args("--softcap 30")).is_ok());
    }
}
