//! An f64 CPU reference of attention forward, for the GPU suite.
//!
//! Straightforward on purpose: one row at a time, full softmax in f64. Inputs
//! are per-sequence slices in `[seq, heads, d]` order (each batch entry or
//! ragged sequence separately).

use crate::spec::Mask;

/// One sequence pair's attention problem.
#[derive(Debug, Clone)]
pub struct RefProblem<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub scale: f64,
    pub softcap: f64,
    pub mask: Mask,
    pub window: (i64, i64),
}

/// Visible key range `[lo, hi]` of query row `i` (empty when `lo > hi`);
/// the same rule as `templates/common/mask.cuh`, written independently.
pub fn visible(mask: Mask, window: (i64, i64), i: i64, sq: i64, sk: i64) -> (i64, i64) {
    let diag = i + sk - sq;
    let (mut lo, mut hi) = (0, sk - 1);
    match mask {
        Mask::None => {}
        Mask::CausalTopLeft => hi = hi.min(i),
        Mask::CausalBottomRight => hi = hi.min(diag),
        Mask::SlidingWindow => {
            if window.0 >= 0 {
                lo = lo.max(diag - window.0);
            }
            if window.1 >= 0 {
                hi = hi.min(diag + window.1);
            }
        }
    }
    (lo, hi)
}

/// O `[seqlen_q, heads_q, d_v]` and LSE `[heads_q, seqlen_q]` (natural log;
/// -inf and O = 0 for rows that see no key).
#[allow(clippy::needless_range_loop)] // j indexes K, V and the scores alike
pub fn attention_fwd(p: &RefProblem) -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, hq, hkv, dq, dv) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.d_qk, p.d_v);
    let mut o = vec![0.0; sq * hq * dv];
    let mut lse = vec![f64::NEG_INFINITY; hq * sq];
    let ratio = hq / hkv;
    let mut scores = vec![0.0; sk];
    for h in 0..hq {
        let hk = h / ratio;
        for i in 0..sq {
            let (lo, hi) = visible(p.mask, p.window, i as i64, sq as i64, sk as i64);
            if lo > hi {
                continue;
            }
            let qrow = &p.q[(i * hq + h) * dq..][..dq];
            let mut mx = f64::NEG_INFINITY;
            for j in lo as usize..=hi as usize {
                let krow = &p.k[(j * hkv + hk) * dq..][..dq];
                let mut s: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * p.scale;
                if p.softcap > 0.0 {
                    s = p.softcap * (s / p.softcap).tanh();
                }
                scores[j] = s;
                mx = mx.max(s);
            }
            let mut sum = 0.0;
            for s in &mut scores[lo as usize..=hi as usize] {
                *s = (*s - mx).exp();
                sum += *s;
            }
            let orow = &mut o[(i * hq + h) * dv..][..dv];
            for j in lo as usize..=hi as usize {
                let w = scores[j] / sum;
                let vrow = &p.v[(j * hkv + hk) * dv..][..dv];
                for (x, y) in orow.iter_mut().zip(vrow) {
                    *x += w * y;
                }
            }
            lse[h * sq + i] = mx + sum.ln();
        }
    }
    (o, lse)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_keys_average_the_values() {
        // All-equal scores: O is the mean of the visible V rows, LSE = ln(n).
        let (sq, sk, d) = (3, 4, 2);
        let q = vec![0.5; sq * d];
        let k = vec![1.0; sk * d];
        let v: Vec<f64> = (0..sk * d).map(|x| x as f64).collect();
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: 1,
            heads_kv: 1,
            d_qk: d,
            d_v: d,
            scale: 1.0,
            softcap: 0.0,
            mask: Mask::CausalBottomRight,
            window: (-1, -1),
        };
        let (o, lse) = attention_fwd(&p);
        // Row 0 sees keys 0..=1 (bottom-right: i + sk - sq = 1).
        assert!((o[0] - 1.0).abs() < 1e-12 && (o[1] - 2.0).abs() < 1e-12);
        assert!((lse[0] - 2f64.ln() - 1.0).abs() < 1e-12);
        // Top-left causal: row 0 sees key 0 only.
        let p2 = RefProblem {
            mask: Mask::CausalTopLeft,
            ..p
        };
        let (o2, _) = attention_fwd(&p2);
        assert!((o2[0] - 0.0).abs() < 1e-12 && (o2[1] - 1.0).abs() < 1e-12);
    }

    #[test]
    fn fully_masked_rows_are_zero_with_neg_inf_lse() {
        // sq > sk with bottom-right causal: the first sq - sk rows see nothing.
        let (sq, sk, d) = (5, 2, 2);
        let q = vec![0.1; sq * d];
        let k = vec![0.2; sk * d];
        let v = vec![0.3; sk * d];
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: 1,
            heads_kv: 1,
            d_qk: d,
            d_v: d,
            scale: 1.0,
            softcap: 0.0,
            mask: Mask::CausalBottomRight,
            window: (-1, -1),
        };
        let (o, lse) = attention_fwd(&p);
        assert!(lse[..3].iter().all(|x| *x == f64::NEG_INFINITY));
        assert!(o[..6].iter().all(|x| *x == 0.0));
        assert!(lse[3].is_finite() && lse[4].is_finite());
    }

    #[test]
    fn window_limits_both_sides() {
        assert_eq!(visible(Mask::SlidingWindow, (2, 1), 5, 10, 10), (3, 6));
        assert_eq!(visible(Mask::SlidingWindow, (-1, 0), 5, 10, 10), (0, 5));
        assert_eq!(visible(Mask::SlidingWindow, (0, -1), 5, 10, 12), (7, 11));
    }
}
