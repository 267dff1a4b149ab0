//! Row-major matrix products through the `gemm` crate (the one burn's flex backend uses): the
//! whole-step CPU path's products ([`crate::fast`]) and the dense attention of short sequences
//! ([`super::cpu`]). Operands are given by strides, so transposes are free; a product into fresh
//! memory skips the zero-fill.

pub use gemm::Parallelism;

/// One `gemm` call: `dst[m, n] (+)= lhs · rhs` with both operands given by their strides.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    (lhs_cs, lhs_rs): (isize, isize),
    rhs: &[f32],
    (rhs_cs, rhs_rs): (isize, isize),
    par: Parallelism,
) {
    assert!(dst.len() >= m * n && lhs.len() >= m * k && rhs.len() >= k * n);
    // SAFETY: the asserts above keep every index the strides reach inside the slices
    // (row-major `[m, k]`, `[k, n]`, `[m, n]` or their transposes of the same sizes).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// Both threads for a product of at least 2¹⁵ multiply-adds, one below (dispatch costs more).
pub(crate) fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m * n * k >= 1 << 15 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// A product's `m · n` output written by `gemm` into fresh memory, without zero-filling it first
/// (a memset of every output was 7 % of a step): `gemm` with `read_dst = false` writes every
/// element and reads none.
pub(crate) fn gemm_new(
    m: usize,
    n: usize,
    k: usize,
    lhs: &[f32],
    lhs_strides: (isize, isize),
    rhs: &[f32],
    rhs_strides: (isize, isize),
    par: Parallelism,
) -> Vec<f32> {
    assert!(lhs.len() >= m * k && rhs.len() >= k * n);
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: `c` has capacity `m · n`; gemm writes each of its `m · n` elements through the raw
    // pointer (row stride `n`, column stride 1) and reads none (`read_dst = false`), so after it
    // returns all `m · n` elements are initialised and `set_len` is sound. The operands' strides
    // stay inside `lhs` and `rhs` by the assert.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            lhs_strides.0,
            lhs_strides.1,
            rhs.as_ptr(),
            rhs_strides.0,
            rhs_strides.1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
        c.set_len(m * n);
    }
    c
}

/// `a [m, k] · b [k, n]`.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    gemm_new(
        m,
        n,
        k,
        a,
        (1, k as isize),
        b,
        (1, n as isize),
        parallelism(m, n, k),
    )
}

/// `a [m, k] · bᵀ` with `b` stored `[n, k]` (bᵀ[p, q] = b[q·k + p]: column stride k, row
/// stride 1).
pub fn matmul_nt(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    gemm_new(
        m,
        n,
        k,
        a,
        (1, k as isize),
        b,
        (k as isize, 1),
        parallelism(m, n, k),
    )
}

/// `c [m, n] += a [m, k] · bᵀ` with `b` stored `[n, k]`.
pub fn matmul_nt_acc(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    gemm_strided(
        m,
        n,
        k,
        c,
        true,
        a,
        (1, k as isize),
        b,
        (k as isize, 1),
        parallelism(m, n, k),
    );
}

/// `c [k, n] += aᵀ · b` with `a` stored `[m, k]` and `b` `[m, n]` (a weight gradient summed
/// over the `m` token rows).
pub fn matmul_tn_into(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    // aᵀ[p, q] = a[q·k + p]: column stride k, row stride 1.
    gemm_strided(
        k,
        n,
        m,
        c,
        true,
        a,
        (k as isize, 1),
        b,
        (1, n as isize),
        parallelism(k, n, m),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three products against their definitions on a 2×3·3×2 case.
    #[test]
    fn products_match_hand_computed_values() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
        assert_eq!(matmul(&a, &b, 2, 3, 2), vec![4.0, 5.0, 10.0, 11.0]);
        // a · aᵀ = [[14, 32], [32, 77]]
        assert_eq!(matmul_nt(&a, &a, 2, 3, 2), vec![14.0, 32.0, 32.0, 77.0]);
        // aᵀ · a = [3, 3], accumulated onto ones.
        let mut c = vec![1.0f32; 9];
        matmul_tn_into(&a, &a, 2, 3, 3, &mut c);
        assert_eq!(
            c,
            vec![18.0, 23.0, 28.0, 23.0, 30.0, 37.0, 28.0, 37.0, 46.0]
        );
    }
}
