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

/// Gradients of one sequence pair: dQ `[seqlen_q, heads_q, d_qk]`, dK
/// `[seqlen_k, heads_kv, d_qk]`, dV `[seqlen_k, heads_kv, d_v]` (dK/dV summed
/// over the query heads of each GQA group) for the upstream gradient `d_o`
/// `[seqlen_q, heads_q, d_v]`.
///
/// Written independently of the kernels' formulation: each row's softmax is
/// recomputed from scratch and the chain rule applied directly, with
/// `Σ_k p_k dp_k` in place of the kernels' `rowsum(dO∘O)`. Rows that see no
/// key contribute nothing.
#[allow(clippy::needless_range_loop)] // j indexes K, V and the scores alike
pub fn attention_bwd(p: &RefProblem, d_o: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (sq, sk, hq, hkv, dq, dv) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.d_qk, p.d_v);
    let mut g_q = vec![0.0; sq * hq * dq];
    let mut g_k = vec![0.0; sk * hkv * dq];
    let mut g_v = vec![0.0; sk * hkv * dv];
    let ratio = hq / hkv;
    // Per visible key: probability, d(loss)/d(probability), d(score)/d(raw score).
    let mut prob = vec![0.0; sk];
    let mut dprob = vec![0.0; sk];
    let mut dz_ds = vec![0.0; sk];
    for h in 0..hq {
        let hk = h / ratio;
        for i in 0..sq {
            let (lo, hi) = visible(p.mask, p.window, i as i64, sq as i64, sk as i64);
            if lo > hi {
                continue;
            }
            let (lo, hi) = (lo as usize, hi as usize);
            let qrow = &p.q[(i * hq + h) * dq..][..dq];
            let gorow = &d_o[(i * hq + h) * dv..][..dv];
            let mut mx = f64::NEG_INFINITY;
            for j in lo..=hi {
                let krow = &p.k[(j * hkv + hk) * dq..][..dq];
                let raw: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * p.scale;
                let (z, dz) = if p.softcap > 0.0 {
                    let th = (raw / p.softcap).tanh();
                    (p.softcap * th, (1.0 - th * th) * p.scale)
                } else {
                    (raw, p.scale)
                };
                prob[j] = z;
                dz_ds[j] = dz;
                mx = mx.max(z);
            }
            let mut sum = 0.0;
            for j in lo..=hi {
                prob[j] = (prob[j] - mx).exp();
                sum += prob[j];
            }
            // dL/dp_j = dO_i . v_j; softmax Jacobian: dz_j = p_j (dp_j - sum_k p_k dp_k).
            let mut pdp = 0.0;
            for j in lo..=hi {
                prob[j] /= sum;
                let vrow = &p.v[(j * hkv + hk) * dv..][..dv];
                dprob[j] = gorow.iter().zip(vrow).map(|(a, b)| a * b).sum();
                pdp += prob[j] * dprob[j];
            }
            for j in lo..=hi {
                let ds = prob[j] * (dprob[j] - pdp) * dz_ds[j];
                let krow = &p.k[(j * hkv + hk) * dq..][..dq];
                for (x, y) in g_q[(i * hq + h) * dq..][..dq].iter_mut().zip(krow) {
                    *x += ds * y;
                }
                for (x, y) in g_k[(j * hkv + hk) * dq..][..dq].iter_mut().zip(qrow) {
                    *x += ds * y;
                }
                for (x, y) in g_v[(j * hkv + hk) * dv..][..dv].iter_mut().zip(gorow) {
                    *x += prob[j] * y;
                }
            }
        }
    }
    (g_q, g_k, g_v)
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

    /// Central finite differences of L = sum(O * dO) against `attention_bwd`,
    /// on tiny problems covering GQA, every mask, softcap and a fully masked row.
    #[test]
    fn backward_matches_finite_differences() {
        let (sq, sk, hq, hkv, dq, dv) = (4, 3, 4, 2, 3, 2);
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                })
                .collect()
        };
        let q = rnd(sq * hq * dq);
        let k = rnd(sk * hkv * dq);
        let v = rnd(sk * hkv * dv);
        let d_o = rnd(sq * hq * dv);
        let cases = [
            (Mask::None, (-1, -1), 0.0),
            (Mask::CausalTopLeft, (-1, -1), 0.0),
            (Mask::CausalBottomRight, (-1, -1), 0.0), // row 0 sees no key (sq > sk)
            (Mask::SlidingWindow, (1, 0), 0.0),
            (Mask::None, (-1, -1), 0.7),
            (Mask::CausalBottomRight, (-1, -1), 1.5),
        ];
        for (mask, window, softcap) in cases {
            let base = RefProblem {
                q: &q,
                k: &k,
                v: &v,
                seqlen_q: sq,
                seqlen_k: sk,
                heads_q: hq,
                heads_kv: hkv,
                d_qk: dq,
                d_v: dv,
                scale: 0.8,
                softcap,
                mask,
                window,
            };
            let (gq, gk, gv) = attention_bwd(&base, &d_o);
            let loss = |qq: &[f64], kk: &[f64], vv: &[f64]| -> f64 {
                let pr = RefProblem {
                    q: qq,
                    k: kk,
                    v: vv,
                    ..base.clone()
                };
                let (o, _) = attention_fwd(&pr);
                o.iter().zip(&d_o).map(|(a, b)| a * b).sum()
            };
            let eps = 1e-6;
            for (which, grad) in [(0, &gq), (1, &gk), (2, &gv)] {
                let x = [&q, &k, &v][which];
                for n in 0..x.len() {
                    let mut plus = x.clone();
                    let mut minus = x.clone();
                    plus[n] += eps;
                    minus[n] -= eps;
                    let (lp, lm) = match which {
                        0 => (loss(&plus, &k, &v), loss(&minus, &k, &v)),
                        1 => (loss(&q, &plus, &v), loss(&q, &minus, &v)),
                        _ => (loss(&q, &k, &plus), loss(&q, &k, &minus)),
                    };
                    let fd = (lp - lm) / (2.0 * eps);
                    assert!(
                        (fd - grad[n]).abs() < 1e-7 * (1.0 + fd.abs()),
                        "{mask:?} softcap {softcap}: d{}[{n}] = {} but finite differences give {fd}",
                        ["q", "k", "v"][which],
                        grad[n]
                    );
                }
            }
            if mask == Mask::CausalBottomRight {
                // Row 0 sees no key: zero gradient for every head.
                for h in 0..hq {
                    assert!(gq[h * dq..][..dq].iter().all(|x| *x == 0.0));
                }
            }
        }
    }

    #[test]
    fn window_limits_both_sides() {
        assert_eq!(visible(Mask::SlidingWindow, (2, 1), 5, 10, 10), (3, 6));
        assert_eq!(visible(Mask::SlidingWindow, (-1, 0), 5, 10, 10), (0, 5));
        assert_eq!(visible(Mask::SlidingWindow, (0, -1), 5, 10, 12), (7, 11));
    }
}
