//! Convolutions: conv1d/conv2d/convolution (grouped, depthwise, asymmetric padding) and
//! conv_transpose2d. Dense convs unfold the input (im2col: `unfolded`, into the gemm's panels
//! as it packs them) and run one gemm per image (or per group of small images), or, when 3x3
//! with stride 1 on large enough images, run by Winograd's F(2x2, 3x3) (`winograd`); with few
//! columns, directly (`narrow`). Grouped convs
//! run the same way for each group of channels (one gemm per image and group, or `narrow`);
//! depthwise convs (groups == in channels) use direct kernels, far faster than one gemm per
//! channel (`depthwise`).

use candle_core::{DType, Tensor, D};

use super::fused::{put, with_f32, Spare};
use super::packed::Columns;
use super::sgemm::{
    into_finished, into_finished_from, new_block, sgemm, tiles, Finish, Mat, Shared,
};
use super::winograd;
use super::{f32_vec, float, from_f32, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};
use depthwise::depthwise;
pub(crate) use unfolded::strided_copy;
use unfolded::{im2col, Gathered, Gathers, Unfolded};

mod depthwise;
#[cfg(target_arch = "x86_64")]
mod narrow;
pub mod small;
mod unfolded;

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.conv2d.default", conv_nd);
    r.add("aten.conv1d.default", conv_nd);
    r.add("aten.conv2d.padding", conv_nd);
    r.add("aten.conv1d.padding", conv_nd);
    // What `torch.jit.trace` records for a conv with string padding, of any rank.
    r.add("aten._convolution_mode.default", conv_nd);
    r.add("aten.convolution.default", convolution);
    r.add("aten.conv_transpose2d.input", conv_transpose);
    r.add("aten.conv_transpose1d.default", conv_transpose);
    r.add(WINOGRAD_TARGET, conv2d_winograd);
    small::register(r);
}

/// Output pixels per image (14 x 14) from which a 3x3 stride-1 convolution runs by
/// Winograd's F(2x2, 3x3) (see `winograd`) rather than as im2col products. A batch of one
/// 14 x 14 image had also been left to the products (its weight transform, done on every
/// call, was not paid back: 1.28x the im2col time on ResNet-18's 256-channel layers, 0.81x at
/// batch 8); with the input transform vectorised over whole blocks, two of those layers took
/// 2.14-2.22 ms by Winograd against 2.49-2.53 by products on 1 thread, 1.30-1.35 against
/// 1.41-1.43 on 2, the third 2.54-2.55 against 2.61-2.62 and 1.45 against 1.39 (least of 9,
/// 2 cores, the weight still transformed per call; BENCHMARKS.md, issue 14).
const WINOGRAD_MIN_PIXELS: usize = 196;

/// Output pixels per image under which the images of a batch run several to a product (their
/// unfolded columns side by side) rather than one product each. Measured on conv shapes of
/// ResNet, MobileNet and EfficientNet at batch 8 (least of 30-40, 2 cores): with unfolded
/// columns (3x3, or strided), at 1 thread the grouped products took 0.18x (2 x 2 pixels) to
/// 0.89x (7 x 7; one run of four 1.05x) the time of one product per image; at 2 threads (two
/// groups) 0.48x to 1.16x. Not for 1x1 stride-1 convs, whose per-image products read the image
/// itself (grouping them adds a copy: 0.75x to 1.51x), nor for one pixel per image
/// (matrix-vector products, 3x faster than one product 8 columns wide).
const GROUP_MAX_PIXELS: usize = 196;

/// Convolution parameters, per spatial dim (always two: 1-d convs run as 2-d with height 1).
#[derive(Clone, Copy)]
struct Params {
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    /// An activation fused onto the output at load (see `prepare::fuse_conv_activations`).
    act: Act,
}

/// The sizes of one convolution call, for the kernels that take them together.
struct Shape {
    /// `[n, c, h, w]`.
    input: [usize; 4],
    /// `[kh, kw]`.
    kernel: [usize; 2],
    /// `[oh, ow]` (as `out_len` gives them for the parameters).
    out: [usize; 2],
}

/// Whether the input is its own columns (read in place, not unfolded): a 1x1 kernel at stride
/// 1 unpadded.
fn reads_in_place(kernel: [usize; 2], p: &Params) -> bool {
    kernel == [1, 1] && p.stride == [1, 1] && p.padding == [0, 0]
}

/// The activation a convolution applies to its output (the graph's own relu / silu /
/// hardswish node, folded into the conv at load), computed as those kernels compute it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    /// None.
    None,
    /// `max(x, 0)`.
    Relu,
    /// `x * sigmoid(x)`.
    Silu,
    /// `x * clamp(x + 3, 0, 6) / 6`.
    Hardswish,
}

impl Act {
    /// The activation of an op key (`aten.relu_.default` → `Relu`), if one can be fused.
    pub fn of_op(key: &str) -> Option<Act> {
        match key {
            "aten.relu.default" | "aten.relu_.default" => Some(Act::Relu),
            "aten.silu.default" | "aten.silu_.default" => Some(Act::Silu),
            "aten.hardswish.default" | "aten.hardswish_.default" => Some(Act::Hardswish),
            _ => None,
        }
    }

    /// The name the fused graph records (`relu`, `silu`, `hardswish`).
    pub fn name(self) -> &'static str {
        match self {
            Act::None => "none",
            Act::Relu => "relu",
            Act::Silu => "silu",
            Act::Hardswish => "hardswish",
        }
    }

    /// The activation applied to a whole tensor: the f32 kernels' pass for f32, candle's
    /// ops for other float dtypes.
    pub(super) fn apply_to(self, t: &Tensor) -> OpResult<Tensor> {
        if self == Act::None {
            return Ok(t.clone());
        }
        if t.dtype() != DType::F32 {
            return self.apply_tensor(t);
        }
        let mut v = super::f32_vec(t)?;
        self.apply(&mut v);
        Ok(Tensor::from_vec(v, t.dims(), t.device())?)
    }

    /// The activation over a tensor of any float dtype through candle's ops (the float64
    /// path), by the formulas of the activation kernels' own fallbacks.
    fn apply_tensor(self, y: &Tensor) -> OpResult<Tensor> {
        Ok(match self {
            Act::None => y.clone(),
            Act::Relu => y.relu()?,
            Act::Silu => (y * super::activation::sigmoid(y)?)?,
            Act::Hardswish => {
                (y * y.affine(1.0, 3.0)?.clamp(0f32, 6f32)?)?.affine(1.0 / 6.0, 0.0)?
            }
        })
    }

    /// [`Act::apply`] on 16 values in a register, the same values it gives (for kernels that
    /// apply the activation before storing their sums).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub(super) fn apply_m512(self, x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // `max` and `min` return their second operand when either is NaN: relu's NaN gives
        // 0 as `f32::max` does, hardswish's stays NaN as `f32::clamp` leaves it.
        let zero = _mm512_setzero_ps();
        match self {
            Act::None => x,
            Act::Relu => _mm512_max_ps(x, zero),
            Act::Silu => super::fused::silu_m512(x),
            Act::Hardswish => {
                let (three, six) = (_mm512_set1_ps(3.0), _mm512_set1_ps(6.0));
                let c = _mm512_min_ps(six, _mm512_max_ps(zero, _mm512_add_ps(x, three)));
                _mm512_div_ps(_mm512_mul_ps(x, c), six)
            }
        }
    }

    pub(super) fn apply(self, xs: &mut [f32]) {
        use super::fused::{hardswish_f32, relu_f32, silu_slice, simd_map_mut};
        match self {
            Act::None => {}
            Act::Relu => simd_map_mut(xs, relu_f32),
            Act::Silu => silu_slice(xs),
            Act::Hardswish => simd_map_mut(xs, hardswish_f32),
        }
    }
}

/// The argument name under which a fused activation is recorded on a conv node.
pub const FUSED_ACT_ARG: &str = "torchport_fused_activation";

/// The argument name under which a residual fused at load (`prepare::fuse_conv_residuals`) is
/// recorded on a conv node: a tensor added to the conv's output before its activation.
pub const FUSED_RESIDUAL_ARG: &str = "torchport_fused_residual";

/// A convolution's per-dim argument (`stride`, `padding`, `dilation`) as `[height, width]`:
/// one value for both dims (for a 1-d convolution, `one_d`: the width, the height 0), or two.
pub(crate) fn pair(v: &[i64], what: &str, one_d: bool) -> OpResult<[usize; 2]> {
    let p = match (v, one_d) {
        ([x], true) => [0, usize_of(*x, what)?],
        ([x], false) => [usize_of(*x, what)?, usize_of(*x, what)?],
        ([y, x], false) => [usize_of(*y, what)?, usize_of(*x, what)?],
        _ => op_bail!("{what} {v:?} has the wrong length"),
    };
    Ok(p)
}

/// Refuse a 2-d convolution whose parameters no kernel can compute: zero stride, dilation,
/// kernel size or groups, channels that do not split into the groups, or a kernel wider
/// than the padded input.
fn check_shapes(x: &Tensor, w: &Tensor, p: &Params) -> OpResult<()> {
    let (cin, cw) = (x.dims()[1], w.dims()[1]);
    if x.dims()[0] > 0 && x.dims()[1..].contains(&0) {
        // torch refuses these too (an input with no channels gives an odd empty result).
        op_bail!(
            "convolution of an empty input {:?}: only an empty batch is supported",
            x.dims()
        );
    }
    if p.groups == 0
        || cw.checked_mul(p.groups) != Some(cin)
        || !w.dims()[0].is_multiple_of(p.groups)
    {
        op_bail!(
            "convolution of {cin} input channels by a weight {:?} in {} groups",
            w.dims(),
            p.groups
        );
    }
    for d in 0..2 {
        let (n, k) = (x.dims()[2 + d], w.dims()[2 + d]);
        if p.stride[d] == 0 || p.dilation[d] == 0 || k == 0 {
            op_bail!(
                "convolution stride {:?}, dilation {:?} and kernel {:?} must be positive",
                p.stride,
                p.dilation,
                &w.dims()[2..]
            );
        }
        let span = p.dilation[d]
            .checked_mul(k - 1)
            .and_then(|v| v.checked_add(1));
        let padded = p.padding[d].checked_mul(2).and_then(|v| v.checked_add(n));
        if span.is_none() || padded.is_none() || span > padded {
            op_bail!(
                "convolution kernel {:?} (dilation {:?}) is larger than the padded input {:?}",
                &w.dims()[2..],
                p.dilation,
                &x.dims()[2..]
            );
        }
    }
    Ok(())
}

/// The activation fused onto this conv node at load, if any.
pub(super) fn fused_act(a: &Args) -> OpResult<Act> {
    Ok(match a.get(FUSED_ACT_ARG) {
        None => Act::None,
        Some(crate::schema::Argument::AsString(s)) => match s.as_str() {
            "relu" => Act::Relu,
            "silu" => Act::Silu,
            "hardswish" => Act::Hardswish,
            other => op_bail!("unknown fused activation '{other}'"),
        },
        Some(_) => op_bail!("{FUSED_ACT_ARG} must be a string"),
    })
}

/// The residual fused onto this conv node at load, if any, batched (it has the conv's
/// output shape, so it is unbatched with an `unbatched` input).
fn fused_residual(a: &Args, unbatched: bool) -> OpResult<Option<Tensor>> {
    Ok(match a.opt_tensor(FUSED_RESIDUAL_ARG)? {
        Some(r) if unbatched => Some(r.unsqueeze(0)?),
        r => r,
    })
}

/// `y` (batched) plus the residual fused onto this conv node at load, if any, promoted as
/// torch's `add` promotes.
pub(super) fn add_fused_residual(a: &Args, y: Tensor, unbatched: bool) -> OpResult<Tensor> {
    match fused_residual(a, unbatched)? {
        Some(r) => add_residual(y, r),
        None => Ok(y),
    }
}

/// `y + r`, broadcast and promoted as torch's `add` does.
fn add_residual(y: Tensor, r: Tensor) -> OpResult<Tensor> {
    use crate::value::TensorOrScalar::Tensor as T;
    let (y, r) = super::binary_operands(&T(y), &T(r))?;
    Ok(y.broadcast_add(&r)?)
}

/// A 2-d convolution of `[N, C, H, W]` by `[O, C / groups, KH, KW]`, with its bias and
/// activation, by the kernels `aten.conv2d` runs, for the kernels that build on it (3-d
/// convolution).
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d_with(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    act: Act,
) -> OpResult<Tensor> {
    let p = Params {
        stride,
        padding,
        dilation,
        groups,
        act,
    };
    conv(x, w, b, None, &p)
}

fn conv_nd(a: &Args) -> OpResult<Outputs> {
    if a.tensor("weight")?.rank() == 5 {
        return super::volume::conv3d(a);
    }
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let b = a.opt_tensor("bias")?;
    // An unbatched input ([C, L] or [C, H, W]) runs as a batch of one.
    let unbatched = x.rank() + 1 == w.rank();
    let mut x = if unbatched { x.unsqueeze(0)? } else { x };
    let one_d = w.rank() == 3;
    let mut stride = pair(&a.ints_or("stride", &[1])?, "stride", one_d)?;
    let mut dilation = pair(&a.ints_or("dilation", &[1])?, "dilation", one_d)?;
    if one_d {
        // A 1-d conv runs as 2-d over a height of 1: stride and dilation 1 there (`pair`
        // gives 0, which made every 1-d conv fail).
        stride[0] = 1;
        dilation[0] = 1;
    }
    let padding = match a.get("padding") {
        Some(crate::schema::Argument::AsString(s)) => {
            match s.as_str() {
                "valid" => [0, 0],
                "same" => {
                    let k = &w.dims()[2..];
                    let (kh, kw) = if one_d { (1, k[0]) } else { (k[0], k[1]) };
                    if stride != [1, 1] {
                        op_bail!("padding='same' needs stride 1 (as in torch)");
                    }
                    let (th, tw) = ((kh - 1) * dilation[0], (kw - 1) * dilation[1]);
                    // An odd total goes one more at the end, as torch pads it.
                    if th % 2 == 1 {
                        x = x.pad_with_zeros(2, 0, 1)?;
                    }
                    if tw % 2 == 1 {
                        x = x.pad_with_zeros(x.rank() - 1, 0, 1)?;
                    }
                    [th / 2, tw / 2]
                }
                p => op_bail!("padding '{p}' is not supported"),
            }
        }
        _ => pair(&a.ints_or("padding", &[0])?, "padding", one_d)?,
    };
    let groups = usize_of(a.int_or("groups", 1)?, "groups")?;
    let act = fused_act(a)?;
    let p = Params {
        stride,
        padding,
        dilation,
        groups,
        act,
    };
    let residual = fused_residual(a, unbatched)?;
    let y = conv(&x, &w, b.as_ref(), residual.as_ref(), &p)?;
    one(if unbatched { y.squeeze(0)? } else { y })
}

fn convolution(a: &Args) -> OpResult<Outputs> {
    if a.bool_or("transposed", false)? {
        if a.tensor("weight")?.rank() == 5 {
            return super::volume::conv_transpose3d(a);
        }
        return conv_transpose(a);
    }
    conv_nd(a)
}

/// A convolution with its own stride and dilation per dim (which candle's conv2d does not
/// take), any dtype: the padded input's windows gathered into columns `[N, C·kh·kw, oh·ow]`
/// (`unfold::columns`, as F.unfold) and each group's weight rows multiplied with its
/// columns. Shapes are checked by the caller (`check_shapes`).
fn conv_by_columns(x: &Tensor, w: &Tensor, p: &Params) -> OpResult<Tensor> {
    let n = x.dims()[0];
    let (o, cg, kh, kw) = w.dims4()?;
    let blocks = super::unfold::Blocks {
        k: [kh, kw],
        d: p.dilation,
        p: p.padding,
        s: p.stride,
    };
    let (oh, ow) = (blocks.count(0, x.dims()[2])?, blocks.count(1, x.dims()[3])?);
    let cols = super::unfold::columns(x, &blocks)?;
    let (groups, og, k) = (p.groups, o / p.groups, cg * kh * kw);
    let w2 = w.contiguous()?.reshape((o, k))?;
    let parts = (0..groups)
        .map(|g| {
            let wg = w2.narrow(0, g * og, og)?.unsqueeze(0)?;
            let cg = cols.narrow(1, g * k, k)?.contiguous()?;
            Ok(wg.broadcast_matmul(&cg)?)
        })
        .collect::<OpResult<Vec<_>>>()?;
    Ok(Tensor::cat(&parts, 1)?.reshape((n, o, oh, ow))?)
}

/// `act(conv(x, w) + b + residual)`, the bias, residual and activation each optional.
fn conv(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
    p: &Params,
) -> OpResult<Tensor> {
    let one_d = w.rank() == 3;
    let (x, w, residual) = if one_d {
        let r = residual.map(|r| r.unsqueeze(D::Minus2)).transpose()?;
        (x.unsqueeze(D::Minus2)?, w.unsqueeze(D::Minus2)?, r)
    } else {
        (x.clone(), w.clone(), residual.cloned())
    };
    if x.rank() != 4 || w.rank() != 4 {
        op_bail!(
            "convolution expects a batched input, got shape {:?}",
            x.dims()
        );
    }
    check_shapes(&x, &w, p)?;
    if x.dims()[0] == 0 {
        // An empty batch gives an empty output, computed here: candle's grouped conv slices
        // the empty input's groups at offsets past its storage (a panic, found by fuzzing).
        let out = |d: usize| {
            let (n, k) = (x.dims()[2 + d], w.dims()[2 + d]);
            out_len(n, k, p.padding[d], p.stride[d], p.dilation[d])
        };
        let y = Tensor::zeros((0, w.dims()[0], out(0)?, out(1)?), x.dtype(), x.device())?;
        return Ok(if one_d { y.squeeze(2)? } else { y });
    }
    let cin = x.dims()[1];
    let (mut bias_done, mut act_done, mut residual_done) = (false, false, residual.is_none());
    // The depthwise kernel does not take the residual: its activation waits for it.
    let pre = Params {
        act: if residual_done { p.act } else { Act::None },
        ..*p
    };
    // float64 skips the f32 kernels (direct depthwise, gemm) for candle's generic conv.
    let f64 = x.dtype() == DType::F64 || w.dtype() == DType::F64;
    let y = if p.groups == cin && p.groups > 1 && w.dims()[1] == 1 && !f64 {
        (bias_done, act_done) = (true, residual_done);
        depthwise(&x, &w, b, &pre)?
    } else if let Some(y) = conv_gemm(&x, Weight::Dense(&w), b, residual.as_ref(), p)? {
        (bias_done, act_done, residual_done) = (true, true, true);
        y
    } else if one_d {
        // A 1-d conv through candle's own conv1d (one stride, padding, dilation).
        let (x1, w1) = (x.squeeze(2)?.contiguous()?, w.squeeze(2)?.contiguous()?);
        x1.conv1d(&w1, p.padding[1], p.stride[1], p.dilation[1], p.groups)?
            .unsqueeze(2)?
    } else if p.stride[0] != p.stride[1] || p.dilation[0] != p.dilation[1] {
        conv_by_columns(&x, &w, p)?
    } else {
        let mut x = x;
        let [ph, pw] = p.padding;
        let pad = if ph == pw {
            ph
        } else {
            x = x.pad_with_zeros(2, ph, ph)?.pad_with_zeros(3, pw, pw)?;
            0
        };
        x.contiguous()?
            .conv2d(&w.contiguous()?, pad, p.stride[0], p.dilation[0], p.groups)?
    };
    let y = match b {
        Some(b) if !bias_done => y.broadcast_add(&float(b)?.reshape((1, (), 1, 1))?)?,
        _ => y,
    };
    let y = match residual {
        Some(r) if !residual_done => add_residual(y, r)?,
        _ => y,
    };
    let y = if p.act != Act::None && !act_done && y.dtype() == DType::F64 {
        p.act.apply_tensor(&y)?
    } else if p.act != Act::None && !act_done {
        let mut v = super::f32_vec(&y)?;
        p.act.apply(&mut v);
        from_f32(v, y.dims())?
    } else {
        y
    };
    Ok(if one_d { y.squeeze(2)? } else { y })
}

/// A dense convolution's weight as [`conv_gemm`] takes it: as the graph gives it, or
/// transformed at load for Winograd's algorithm ([`winograd::weights`]: `[16][co][ci]`).
#[derive(Clone, Copy)]
enum Weight<'a> {
    Dense(&'a Tensor),
    Winograd { u: &'a Tensor, co: usize, ci: usize },
}

/// Whether [`conv_gemm`] runs a dense float32 convolution (groups 1) of an `[n, c, h, w]`
/// input by a `[co, c, kh, kw]` weight by Winograd's algorithm: neither the direct kernel
/// for few columns (`narrow`) nor products. `prepare` transforms those convolutions' weights
/// at load ([`WINOGRAD_TARGET`]), where each call would otherwise transform them again.
pub(crate) fn runs_by_winograd(
    [_, c, h, w]: [usize; 4],
    [co, ci, kh, kw]: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> bool {
    let p = Params {
        stride,
        padding,
        dilation,
        groups: 1,
        act: Act::None,
    };
    let out = |d: usize| out_len([h, w][d], [kh, kw][d], padding[d], stride[d], dilation[d]);
    let (Ok(oh), Ok(ow)) = (out(0), out(1)) else {
        return false;
    };
    let path = dense_path(co, [kh, kw], &p, [c, h, w], oh * ow);
    ci == c && co > 0 && matches!(path, DensePath::Winograd(_))
}

/// The kernel [`conv_gemm`] runs a dense float32 convolution (groups 1, its weight as the
/// graph gives it) by: directly where it has few columns (input channels times taps) on a
/// large plane (`narrow`), else by Winograd's algorithm where [`winograd_geometry`] applies,
/// else as products.
enum DensePath {
    #[cfg(target_arch = "x86_64")]
    Narrow,
    Winograd(winograd::Geometry),
    Products,
}

/// [`DensePath`] for a convolution of `co` output channels, `kernel`, `p`, an `[c, h, w]`
/// image and `pix` output pixels per image.
fn dense_path(
    co: usize,
    kernel: [usize; 2],
    p: &Params,
    image: [usize; 3],
    pix: usize,
) -> DensePath {
    #[cfg(target_arch = "x86_64")]
    if narrow::applies(image[0], kernel, pix, p) {
        return DensePath::Narrow;
    }
    winograd_geometry(co, kernel, p, image, pix).map_or(DensePath::Products, DensePath::Winograd)
}

/// The node target of a convolution whose weight was transformed at load for Winograd's
/// algorithm: the arguments of `aten.conv2d.default` (`input`, `weight`, `bias`, `stride`,
/// `padding`, `dilation`; groups 1, stride and dilation 1), the fused activation and residual
/// if any, and `weight_shape`, the weight's `[out_channels, in_channels, 3, 3]`; `weight`
/// holds its transform (`winograd::weights`, `16 * out_channels * in_channels` values, 1-d).
pub const WINOGRAD_TARGET: &str = "torchport.conv2d_winograd.default";

/// A `[co, ci, 3, 3]` float32 weight transformed for Winograd's algorithm, as
/// [`WINOGRAD_TARGET`] reads it (1-d); `None` for any other tensor.
pub(crate) fn winograd_weight(w: &Tensor) -> Option<Tensor> {
    let (co, ci, kh, kw) = w.dims4().ok()?;
    if (kh, kw) != (3, 3) || w.dtype() != DType::F32 {
        return None;
    }
    let w = w.contiguous().ok()?;
    // Into huge pages where the kernel gives them: fresh memory written once (the transforms
    // of ResNet-18's weights are 16.8 MB).
    let space = crate::allocator::weight_space(16 * co * ci);
    let u = with_f32(&w, |v| winograd::weights_into(v, co, ci, space))?;
    let len = u.len();
    Tensor::from_vec(u, len, w.device()).ok()
}

/// The `weight_shape` (`[out, in, kh, kw]`; a negative size reads as `usize::MAX`, which no
/// stored weight holds) and the parameters of a convolution node the load rewrote to read its
/// weight in another layout (`small::TARGET`, [`WINOGRAD_TARGET`]): 2-d, integer padding,
/// groups 1.
fn rewritten_conv(a: &Args) -> OpResult<([usize; 4], Params)> {
    let shape = a.ints("weight_shape")?;
    let &[co, ci, kh, kw] = shape.as_slice() else {
        op_bail!("weight_shape must be [out, in, kh, kw], got {shape:?}");
    };
    let p = Params {
        stride: pair(&a.ints_or("stride", &[1])?, "stride", false)?,
        padding: pair(&a.ints_or("padding", &[0])?, "padding", false)?,
        dilation: pair(&a.ints_or("dilation", &[1])?, "dilation", false)?,
        groups: usize_of(a.int_or("groups", 1)?, "groups")?,
        act: fused_act(a)?,
    };
    if p.groups != 1 {
        op_bail!(
            "a convolution with its weight stored for it has groups 1, got {}",
            p.groups
        );
    }
    let shape = [co, ci, kh, kw].map(|v| usize::try_from(v).unwrap_or(usize::MAX));
    Ok((shape, p))
}

/// `torchport.conv2d_winograd`.
fn conv2d_winograd(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let u = a.tensor("weight")?;
    let ([co, ci, kh, kw], p) = rewritten_conv(a)?;
    if [kh, kw] != [3, 3] || p.stride != [1, 1] || p.dilation != [1, 1] {
        op_bail!("a Winograd convolution has a 3x3 kernel, stride and dilation 1");
    }
    let fits = ci.checked_mul(co).and_then(|v| v.checked_mul(16)) == Some(u.elem_count());
    if u.rank() != 1 || u.dtype() != DType::F32 || !fits {
        op_bail!(
            "transformed weight of shape {:?} ({:?}) does not hold 16 x {co} x {ci} values",
            u.dims(),
            u.dtype()
        );
    }
    match x.dims() {
        &[_, c, _, _] if x.dtype() == DType::F32 && c == ci => {}
        d => op_bail!(
            "a Winograd convolution takes a float32 [N, {ci}, H, W] input, got {:?} {d:?}",
            x.dtype()
        ),
    }
    let residual = fused_residual(a, false)?;
    let b = a.opt_tensor("bias")?;
    let weight = Weight::Winograd { u: &u, co, ci };
    match conv_gemm(&x, weight, b.as_ref(), residual.as_ref(), &p)? {
        Some(y) => one(y),
        None => op_bail!(
            "Winograd convolution: the bias ({co} values) or residual does not fit the output"
        ),
    }
}

/// Dense convolution (groups 1, f32) as one gemm per image: the input unfolded (im2col) into
/// a `[c_in * kh * kw, oh * ow]` matrix whose rows follow the weight's own order, so the
/// weight `[c_out, c_in, kh, kw]` is read as the `[c_out, c_in * kh * kw]` matrix it already
/// is and `weight @ cols` is the NCHW output itself (no reordering of weight or output). A 1x1
/// convolution with stride 1 and no padding uses the input as `cols` directly; a 3x3 one with
/// stride 1 on large enough images runs by Winograd's algorithm instead (`winograd`). Each
/// image's product is written straight into its place in a new output, the bias and residual
/// added and the activation applied to each stretch as the product finishes it
/// (`products`); with at least as many
/// images as threads the images run in parallel (one single-threaded product each; small
/// unfolded images several to a product, one group per thread: `GROUP_MAX_PIXELS`); with
/// fewer, side by side too, each product split over its share of the threads (`share`). Any
/// per-dim stride, padding and dilation. `None` when the layout does not apply.
fn conv_gemm(
    x: &Tensor,
    weight: Weight,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    p: &Params,
) -> OpResult<Option<Tensor>> {
    use rayon::prelude::*;
    let (n, c, h, wd) = x.dims4()?;
    let (w, (co, ci, kh, kw)) = match weight {
        Weight::Dense(w) => (w, w.dims4()?),
        Weight::Winograd { u, co, ci } => (u, (co, ci, 3, 3)),
    };
    // Grouped: each group's own channels (`ci` of the `c` per image), by products or the
    // direct kernel (never Winograd's, nor several images to a product).
    let grouped = p.groups > 1;
    if p.groups == 0
        || ci.checked_mul(p.groups) != Some(c)
        || (grouped && !matches!(weight, Weight::Dense(_)))
        || co % p.groups != 0
        || kh == 0
        || kw == 0
        || x.dtype() != DType::F32
        || w.dtype() != DType::F32
    {
        return Ok(None);
    }
    let bias = match bias {
        Some(b) => match small_f32(b, co) {
            Some(v) => Some(v),
            None => return Ok(None),
        },
        None => None,
    };
    let oh = out_len(h, kh, p.padding[0], p.stride[0], p.dilation[0])?;
    let ow = out_len(wd, kw, p.padding[1], p.stride[1], p.dilation[1])?;
    let k = ci * kh * kw;
    let pix = oh * ow;
    let w = w.contiguous()?;
    let x = x.contiguous()?;
    let direct = reads_in_place([kh, kw], p);
    let path = match weight {
        Weight::Dense(_) => dense_path(co, [kh, kw], p, [c, h, wd], pix),
        // Weights transformed at load run by Winograd's algorithm whatever the plane
        // (`conv2d_winograd` checked the stride, dilation and the transform's length).
        Weight::Winograd { .. } => DensePath::Winograd(winograd::Geometry {
            c,
            h,
            w: wd,
            co,
            pad: p.padding,
        }),
    };
    let geometry = match path {
        #[cfg(target_arch = "x86_64")]
        DensePath::Narrow => return narrow::conv(&x, &w, bias.as_deref(), residual, p),
        DensePath::Winograd(g) => Some(g),
        DensePath::Products => None,
    };
    let per_image = c * h * wd;
    // Several small images to a product, their columns side by side (see `group`): as many
    // groups as threads, each computed on one; or, where the images do not split evenly
    // over the threads (`share` splits each), all of them in one product split over the
    // threads (3 images on 2 threads had been groups of 2 and 1).
    let threads = rayon::current_num_threads();
    let share = share(n, threads);
    let small = (2..GROUP_MAX_PIXELS).contains(&pix);
    let (per, group_threads) =
        if geometry.is_none() && !direct && !grouped && small && n > 1 && n >= threads {
            match share {
                1 => (n.div_ceil(threads), 1),
                _ => (n, threads),
            }
        } else {
            (1, 1)
        };
    // A residual of another shape or dtype (the graph's metadata said otherwise) is left to
    // `conv`'s general paths.
    let residual = match residual {
        Some(r) if r.dims() == [n, co, oh, ow] && r.dtype() == DType::F32 => Some(r.contiguous()?),
        Some(_) => return Ok(None),
        None => None,
    };
    let accumulate = residual.is_some();
    // One product per image (not Winograd's, not a group's) writes a new output, each stretch
    // of it finished (bias, residual, activation) as the product completes it. Winograd's
    // output starts as the residual, written image by image just before each image's blocks
    // add onto it (`starting`); a group's as the residual or zeros (it adds the bias itself);
    // else Winograd's as zeros.
    let finished = geometry.is_none() && per == 1;
    let late = geometry.is_some() && accumulate;
    let mut out = match &residual {
        _ if finished || late => Vec::new(),
        Some(r) => f32_vec(r)?,
        None => super::fused::zeros(n * co * pix),
    };
    let res = with_f32(&w, |wm| {
        // Winograd's geometry with the transformed weights, when that path applies.
        let wino = geometry.map(|g| match weight {
            Weight::Winograd { .. } => (g, std::borrow::Cow::Borrowed(wm)),
            Weight::Dense(_) => (g, std::borrow::Cow::Owned(winograd::weights(wm, co, c))),
        });
        with_f32(&x, |xs| {
            if pix == 0 || co == 0 {
                return Some(out);
            }
            if finished {
                let shape = Shape {
                    input: [n, c, h, wd],
                    kernel: [kh, kw],
                    out: [oh, ow],
                };
                return products(xs, wm, co, residual.as_ref(), bias.as_deref(), &shape, p);
            }
            // One image by Winograd's algorithm, its blocks split for `threads` threads.
            let one_image = |img: &[f32], dst: &mut [f32], threads: usize| -> bool {
                let Some((g, u)) = &wino else {
                    return false;
                };
                let b = bias.as_deref();
                winograd::conv_image(img, u, g, b, p.act, dst, accumulate, threads)
            };
            let group =
                |cols: &mut Vec<f32>, prod: &mut Vec<f32>, dst: &mut [f32], imgs: &[f32]| {
                    let wide = imgs.len() / per_image * pix;
                    cols.resize(k * wide, 0.0);
                    for (img, at) in imgs.chunks_exact(per_image).zip((0..).step_by(pix)) {
                        // The image's columns `at..` of each row: one panel `wide` wide from
                        // column `at`, its first `pix` columns written.
                        let unfolded = Unfolded::new(img, [c, h, wd], [kh, kw], ow, p);
                        unfolded.pack(0..k, 0..pix, wide, &mut cols[at..]);
                    }
                    prod.resize(co * wide, 0.0);
                    if let Some(b) = &bias {
                        for (row, &v) in prod.chunks_exact_mut(wide).zip(b) {
                            row.fill(v);
                        }
                    }
                    let w = Mat::rows(wm, k);
                    let ok = sgemm(
                        co,
                        wide,
                        k,
                        w,
                        Mat::rows(cols, wide),
                        prod,
                        wide,
                        bias.is_some(),
                        1.0,
                        group_threads,
                    );
                    // The product's row o holds channel o of each image in turn.
                    for (o, row) in prod.chunks_exact(wide).enumerate() {
                        for (part, img) in row.chunks_exact(pix).zip(dst.chunks_exact_mut(co * pix))
                        {
                            let d = &mut img[o * pix..][..pix];
                            if accumulate {
                                d.iter_mut().zip(part).for_each(|(d, &v)| *d += v);
                            } else {
                                d.copy_from_slice(part);
                            }
                        }
                    }
                    p.act.apply(dst);
                    ok
                };
            let ok = if let (true, Some(r)) = (late, &residual) {
                let then = |i: usize, dst: &mut [f32]| {
                    one_image(&xs[i * per_image..][..per_image], dst, share)
                };
                let ok;
                (out, ok) = with_f32(r, |rs| starting(n, rs, pix, share, then))?;
                ok
            } else if per > 1 {
                out.par_chunks_mut(per * co * pix)
                    .zip(xs.par_chunks(per * per_image))
                    .map_init(
                        || (Spare::take(), Spare::take()),
                        |(cols, prod), (dst, imgs)| group(cols, prod, dst, imgs),
                    )
                    .all(|ok| ok)
            } else {
                // The images side by side (a lone image on this thread).
                out.par_chunks_mut(co * pix)
                    .zip(xs.par_chunks(per_image))
                    .all(|(dst, img)| one_image(img, dst, share))
            };
            ok.then_some(out)
        })
    });
    match res.flatten().flatten() {
        Some(out) => Ok(Some(Tensor::from_vec(out, (n, co, oh, ow), x.device())?)),
        None => Ok(None),
    }
}

/// The threads each of `images` images running side by side gets of `threads`: fewer images
/// than threads, an equal share, rounded up so that no thread idles (a batch of 8 on 16
/// threads: 2 each; one image: all). At least as many, 1 where that keeps the threads
/// within an eighth of evenly loaded (a batch of 8 on 2 threads, or 9), else the fewest
/// parts per image that do (3 images on 2 threads: 2 each, six halves of an image for two
/// threads where three whole ones kept one thread idle a third of the time; 17 on 16: 6).
/// Running the images of a small batch one after another, each split over all the threads,
/// cut their products and Winograd blocks into slivers: ResNet-50 at batch 8 took 280 ms in
/// its convolutions on 16 threads against 142 on 8 (BENCHMARKS.md, issue 14).
fn share(images: usize, threads: usize) -> usize {
    if images < threads {
        return threads.div_ceil(images.max(1));
    }
    // Parts of `s` per image: the busiest thread runs `ceil(images * s / threads)` of them,
    // against `images * s / threads` if even.
    let even = |s: usize| (images * s).div_ceil(threads) * threads * 8 <= images * s * 9;
    (1..threads).find(|&s| even(s)).unwrap_or(threads)
}

/// A float32 convolution of `xs` (`[n, c, h, w]`) by `w` (`[co, c / groups * kh * kw]`) as one
/// product per image and group of channels (`p.groups`; its columns: the group's input
/// channels themselves for a 1x1 kernel at stride 1 unpadded, else unfolded: straight into
/// the product's panels as it packs them, where this CPU has the microkernels for it
/// ([`Unfolded`]), else into a matrix first; its rows the group's output channels), each
/// written straight into a new output, each stretch of a row
/// finished as the product completes it: the bias and the residual (`[n, co, oh, ow]`, each
/// optional) added and the activation applied while the stretch is in cache. They had been
/// passes of their own over the whole output, before the product (the residual copied, the
/// bias added) and after it (the activation). The products run side by side on the pool,
/// each split over its share of the threads (`share`). `None` where a view does not fit.
///
/// A grouped convolution had gone through candle's, one group after another on one thread:
/// RegNetY-400MF's (8 channels a group) took 4.6 ms at 48 channels on 56 x 56, 4.7 GFLOP/s
/// (BENCHMARKS.md, issue 14).
fn products(
    xs: &[f32],
    w: &[f32],
    co: usize,
    residual: Option<&Tensor>,
    bias: Option<&[f32]>,
    shape: &Shape,
    p: &Params,
) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let ([n, c, h, wd], [kh, kw], [oh, ow]) = (shape.input, shape.kernel, shape.out);
    let groups = p.groups.max(1);
    // Each group's input and output channels.
    let (cg, og) = (c / groups, co / groups);
    let (k, pix, per_image) = (cg * kh * kw, oh * ow, c * h * wd);
    let units = n * groups;
    if units == 0 {
        return Some(Vec::new());
    }
    let direct = reads_in_place([kh, kw], p);
    let share = share(units, rayon::current_num_threads());
    // Unfolded straight into the product's panels where this CPU has the microkernels for it
    // and each tile of the product unfolds only its own columns: on one thread, or in bands
    // of columns. Bands of rows would each unfold all of them (a 256-channel 3x3 stride-2
    // convolution on 2 threads took 1.10x its time so), and a product that does not split
    // runs on the gemm's own threads.
    let own = super::packed::Packing::detect();
    let own = own
        .as_ref()
        .filter(|_| !direct && (share == 1 || matches!(tiles(og, pix, k, share), (1, c) if c > 1)));
    // Narrow output rows: gathered rather than copied a row's stretch at a time.
    let gathers = own.and_then(|_| Gathers::new([cg, h, wd], [kh, kw], [oh, ow], p));
    let run = |rs: Option<&[f32]>| {
        // Group `g` of image `i` (`u = i * groups + g`) into its `[og, pix]` part of `out`,
        // `cols` its unfolded columns: the output's channels `u * og..` in the image order.
        let unit = |u: usize, cols: &mut Vec<f32>, out: Shared| -> bool {
            let (i, g) = (u / groups, u % groups);
            let img = &xs[i * per_image + g * cg * h * wd..][..cg * h * wd];
            // The columns: a matrix (the image itself, read in place, or unfolded into one
            // first), or unfolded panel by panel as the product packs them (see `own`).
            enum Cols<'c> {
                Matrix(&'c [f32]),
                Panels(&'c super::packed::Packing),
            }
            let cols = match own {
                _ if direct => Cols::Matrix(img),
                Some(pk) => Cols::Panels(pk),
                None => {
                    cols.resize(k * pix, 0.0);
                    im2col(img, [cg, h, wd], [kh, kw], [oh, ow], p, cols, share > 1);
                    Cols::Matrix(cols)
                }
            };
            let res = rs.map(|r| &r[u * og * pix..][..og * pix]);
            let finish = |o: usize, j: usize, row: &mut [f32]| {
                if let Some(b) = bias {
                    let v = b[g * og + o];
                    row.iter_mut().for_each(|x| *x += v);
                }
                if let Some(r) = res {
                    row.iter_mut()
                        .zip(&r[o * pix + j..])
                        .for_each(|(x, &v)| *x += v);
                }
                p.act.apply(row);
            };
            let any = bias.is_some() || res.is_some() || p.act != Act::None;
            let a = Mat::rows(&w[g * og * k..][..og * k], k);
            // SAFETY: the unit's part of the new output (`og * pix` values from `u * og *
            // pix`) is this call's alone, and k > 0 (the caller checked the shapes), so the
            // product writes every value of it before `finish` reads any.
            #[allow(unsafe_code)]
            unsafe {
                let out = Shared(out.0.add(u * og * pix));
                let finish = any.then_some(&finish as Finish);
                match cols {
                    Cols::Matrix(cols) => {
                        let b = Mat::rows(cols, pix);
                        into_finished((og, pix, k), a, b, out, pix, share, finish)
                    }
                    Cols::Panels(pk) => {
                        let dims = (og, pix, k);
                        if let Some(gathers) = &gathers {
                            let b = Gathered {
                                xs: img,
                                gathers,
                                first: 0,
                            };
                            into_finished_from(pk, dims, a, &b, out, pix, share, finish)
                        } else {
                            let b = Unfolded::new(img, [cg, h, wd], [kh, kw], ow, p);
                            into_finished_from(pk, dims, a, &b, out, pix, share, finish)
                        }
                    }
                }
            }
        };
        // SAFETY: the units' parts cover the new buffer, each written whole by its product
        // when every product returns true.
        #[allow(unsafe_code)]
        unsafe {
            new_block(n * co * pix, |out| {
                if units > 1 {
                    (0..units)
                        .into_par_iter()
                        .map_init(Spare::take, |cols, u| unit(u, cols, out))
                        .all(|ok| ok)
                } else {
                    unit(0, &mut Spare::take(), out)
                }
            })
        }
    };
    match residual {
        Some(r) => with_f32(r, |rs| run(Some(rs))).flatten(),
        None => run(None),
    }
}

/// `images` outputs of `[channels, plane]`, each written as its image's part of `residual`
/// (`[images, channels, plane]`) and then handed to `then(image, output)` (on the pool's
/// threads, an image each; on this thread for one image), which adds onto it; with whether
/// every call returned true. An image's part is copied over its `threads` (its share of the
/// pool) when it has more than one. Where all images' outputs were written before the first
/// image's work, a batch's output larger than the cache was read back from memory by each
/// (BENCHMARKS.md, issue 14).
fn starting(
    images: usize,
    residual: &[f32],
    plane: usize,
    threads: usize,
    then: impl Fn(usize, &mut [f32]) -> bool + Sync,
) -> (Vec<f32>, bool) {
    use rayon::prelude::*;
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicBool, Ordering};
    let ok = AtomicBool::new(true);
    let image = residual.len() / images.max(1);
    let write = |at: usize, chunk: &mut [MaybeUninit<f32>]| {
        let r = &residual[at..][..chunk.len()];
        let part = PLANES_PER_TASK * plane.max(1);
        if threads > 1 {
            let parts = chunk.par_chunks_mut(part).zip(r.par_chunks(part));
            parts.for_each(|(d, r)| put(d, r));
        } else {
            put(chunk, r);
        }
        // SAFETY: `put` above initialised every element (the chunk is as long as its part
        // of the residual).
        #[allow(unsafe_code)]
        let dst = unsafe { super::fused::assume_written(chunk) };
        if !then(at / image.max(1), dst) {
            ok.store(false, Ordering::Relaxed);
        }
    };
    // SAFETY: each chunk is one whole image (the chunk size is one image's), and `write`
    // initialises all of it.
    #[allow(unsafe_code)]
    let out = unsafe { super::fused::written(images * image, image, write) };
    (out, ok.load(Ordering::Relaxed))
}

/// Planes per task where an image's part of a residual is copied over several threads.
const PLANES_PER_TASK: usize = 8;

/// The Winograd geometry of a convolution that `winograd` should compute: 3x3, groups 1, stride 1,
/// dilation 1, with at least WINOGRAD_MIN_PIXELS output pixels per image: enough tiles per
/// product.
fn winograd_geometry(
    co: usize,
    k: [usize; 2],
    p: &Params,
    [c, h, w]: [usize; 3],
    pix: usize,
) -> Option<winograd::Geometry> {
    let wanted = k == [3, 3]
        && p.groups == 1
        && p.stride == [1, 1]
        && p.dilation == [1, 1]
        && pix >= WINOGRAD_MIN_PIXELS;
    wanted.then_some(winograd::Geometry {
        c,
        h,
        w,
        co,
        pad: p.padding,
    })
}

/// The values of a small f32 tensor of exactly `len` elements (a bias), any layout.
fn small_f32(t: &Tensor, len: usize) -> Option<Vec<f32>> {
    if t.elem_count() != len {
        return None;
    }
    t.to_dtype(DType::F32)
        .ok()?
        .flatten_all()
        .ok()?
        .to_vec1()
        .ok()
}

/// Output length of a convolution (or of an unfold's block positions) along one dim.
pub(crate) fn out_len(
    len: usize,
    k: usize,
    pad: usize,
    stride: usize,
    dil: usize,
) -> OpResult<usize> {
    let eff = dil * (k - 1) + 1;
    let padded = len + 2 * pad;
    if padded < eff || stride == 0 {
        op_bail!("the kernel ({k}, dilation {dil}) is larger than the padded input ({padded})");
    }
    Ok((padded - eff) / stride + 1)
}

fn conv_transpose(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let b = a.opt_tensor("bias")?;
    // An unbatched input ([C, L] or [C, H, W]) runs as a batch of one.
    let unbatched = x.rank() + 1 == w.rank();
    let x = if unbatched { x.unsqueeze(0)? } else { x };
    let one_d = w.rank() == 3;
    let (x, w) = if one_d {
        (x.unsqueeze(2)?, w.unsqueeze(2)?)
    } else {
        (x, w)
    };
    let stride = pair(&a.ints_or("stride", &[1])?, "stride", one_d)?;
    let padding = pair(&a.ints_or("padding", &[0])?, "padding", one_d)?;
    let out_pad = pair(&a.ints_or("output_padding", &[0])?, "output_padding", one_d)?;
    let dilation = pair(&a.ints_or("dilation", &[1])?, "dilation", one_d)?;
    let groups = usize_of(a.int_or("groups", 1)?, "groups")?;
    let ci = x.dims().get(1).copied().unwrap_or(0);
    if groups == 0 || !ci.is_multiple_of(groups) || w.dims()[0] != ci {
        op_bail!(
            "conv_transpose of {ci} input channels by a weight {:?} in {groups} groups",
            w.dims()
        );
    }
    // Groups: each slice of input channels through its slice of the weight (whose dim 1 is
    // the group's output channels), the outputs side by side.
    let per = ci / groups;
    let ys = (0..groups)
        .map(|g| {
            let xg = x.narrow(1, g * per, per)?;
            let wg = w.narrow(0, g * per, per)?;
            conv_transpose2d(&xg, &wg, stride, padding, out_pad, dilation)
        })
        .collect::<OpResult<Vec<_>>>()?;
    let y = match ys.as_slice() {
        [one] => one.clone(),
        _ => Tensor::cat(&ys, 1)?,
    };
    let y = match b {
        Some(b) => y.broadcast_add(&float(&b)?.reshape((1, (), 1, 1))?)?,
        None => y,
    };
    let y = if one_d { y.squeeze(2)? } else { y };
    one(if unbatched { y.squeeze(0)? } else { y })
}

/// Transposed 2-d convolution, written out directly (scatter of each input pixel through the
/// kernel) so that per-dim strides, paddings and output paddings are all supported.
fn conv_transpose2d(
    x: &Tensor,
    w: &Tensor,
    stride: [usize; 2],
    padding: [usize; 2],
    out_pad: [usize; 2],
    dil: [usize; 2],
) -> OpResult<Tensor> {
    let (n, ci, h, wd) = x.dims4()?;
    let (wci, co, kh, kw) = w.dims4()?;
    if wci != ci {
        op_bail!("conv_transpose weight has {wci} input channels, the input {ci}");
    }
    if h == 0 || wd == 0 || kh == 0 || kw == 0 || co == 0 || n == 0 {
        op_bail!(
            "conv_transpose needs non-empty inputs and kernels, got input {:?} and weight {:?}",
            x.dims(),
            w.dims()
        );
    }
    // (h - 1) * stride + dil * (k - 1) + 1 + out_pad, checked.
    let full = |len: usize, s: usize, d: usize, k: usize, op: usize| {
        (len - 1)
            .checked_mul(s)?
            .checked_add(d.checked_mul(k - 1)?)?
            .checked_add(op.checked_add(1)?)
    };
    let (Some(full_h), Some(full_w)) = (
        full(h, stride[0], dil[0], kh, out_pad[0]),
        full(wd, stride[1], dil[1], kw, out_pad[1]),
    ) else {
        op_bail!("conv_transpose output size overflows");
    };
    let (Some(ph), Some(pw)) = (padding[0].checked_mul(2), padding[1].checked_mul(2)) else {
        op_bail!("conv_transpose padding overflows");
    };
    if full_h <= ph || full_w <= pw {
        op_bail!("conv_transpose padding is larger than the output");
    }
    let oh = full_h - ph;
    let ow = full_w - pw;
    if [n, co, oh, ow]
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .is_none()
    {
        op_bail!("conv_transpose output size overflows");
    }
    // cols[(co, kh, kw), (h, w)] = W^T x, then col2im.
    let xm = x.contiguous()?.reshape((n, ci, h * wd))?;
    let wm = w
        .contiguous()?
        .reshape((ci, co * kh * kw))?
        .t()?
        .contiguous()?;
    let cols = wm.broadcast_matmul(&xm)?; // [n, co*kh*kw, h*w]
    let geo = (n, co, [kh, kw], [h, wd], [oh, ow]);
    if cols.dtype() == DType::F64 {
        let v = cols.flatten_all()?.to_vec1::<f64>()?;
        return col2im(&v, geo, stride, padding, dil);
    }
    col2im(&f32_vec(&cols)?, geo, stride, padding, dil)
}

/// `(n, c_out, [kh, kw], [h, w], [oh, ow])` of a transposed convolution.
pub(super) type Geometry = (usize, usize, [usize; 2], [usize; 2], [usize; 2]);

/// The scatter half of a transposed convolution: `cols [n, co * kh * kw, h * w]` summed into
/// the `[n, co, oh, ow]` output, in the element type of `cols` (f32, or f64 for float64).
pub(super) fn col2im<T: candle_core::WithDType>(
    cols: &[T],
    (n, co, [kh, kw], [h, wd], [oh, ow]): Geometry,
    stride: [usize; 2],
    padding: [usize; 2],
    dil: [usize; 2],
) -> OpResult<Tensor> {
    let mut out = vec![T::from_f64(0.0); n * co * oh * ow];
    for b in 0..n {
        for c in 0..co {
            let dst = &mut out[(b * co + c) * oh * ow..][..oh * ow];
            for i in 0..kh {
                for j in 0..kw {
                    let row = &cols[((b * co + c) * kh * kw + i * kw + j) * h * wd..][..h * wd];
                    for y in 0..h {
                        let oy = (y * stride[0] + i * dil[0]) as isize - padding[0] as isize;
                        if oy < 0 || oy >= oh as isize {
                            continue;
                        }
                        for xx in 0..wd {
                            let ox = (xx * stride[1] + j * dil[1]) as isize - padding[1] as isize;
                            if ox >= 0 && ox < ow as isize {
                                dst[oy as usize * ow + ox as usize] += row[y * wd + xx];
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Tensor::from_vec(
        out,
        (n, co, oh, ow),
        &candle_core::Device::Cpu,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Each activation applied in a register (`Act::apply_m512`, for kernels that activate
    /// their sums before storing them) gives the bits the slice kernels give, on ordinary
    /// values and on NaN, infinities, signed zeros and hardswish's and silu's turning points.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn activations_in_registers_match_the_slice_kernels() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut xs: Vec<f32> = vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            -3.0,
            3.0,
            -3.5,
            3.5,
            88.0,
            -88.0,
            90.0,
            -90.0,
            1e-30,
            -1e-30,
            f32::MAX,
        ];
        xs.extend((0..400).map(|i| (i as f32 - 200.0) * 0.0731));
        for act in [Act::None, Act::Relu, Act::Silu, Act::Hardswish] {
            let mut want = xs.clone();
            act.apply(&mut want);
            for (chunk, want) in xs.chunks(16).zip(want.chunks(16)) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F and FMA were found above; the loads and the store cover
                // the chunk's and `got`'s values only.
                #[allow(unsafe_code)]
                unsafe {
                    use std::arch::x86_64::*;
                    let mask = ((1u32 << chunk.len()) - 1) as u16;
                    let x = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
                    _mm512_mask_storeu_ps(got.as_mut_ptr(), mask, act.apply_m512(x));
                }
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        g.to_bits() == w.to_bits()
                            || (g.is_nan() && w.is_nan())
                            || (*g == 0.0 && *w == 0.0),
                        "{act:?}: {g} against {w}"
                    );
                }
            }
        }
    }

    /// `f` run on a rayon pool of `threads` threads.
    fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        pool.unwrap().install(f)
    }

    /// Each image's share of the threads: every thread busy within an eighth of evenly,
    /// with as few parts per image as that takes.
    #[test]
    fn shares_keep_every_thread_busy() {
        // Fewer images than threads: an equal share, rounded up.
        assert_eq!(share(1, 16), 16);
        assert_eq!(share(8, 16), 2);
        assert_eq!(share(3, 16), 6);
        assert_eq!(share(0, 4), 4);
        // As many or more: whole images where they split evenly enough...
        for (images, threads) in [(2, 2), (8, 2), (9, 2), (16, 16), (32, 16), (1, 1), (5, 1)] {
            assert_eq!(share(images, threads), 1, "{images} on {threads}");
        }
        // ...else parts of images: 3 on 2 threads in halves, 5 on 4 in thirds (the busiest
        // thread runs 4 thirds against 3.75), 17 on 16 in sixths (7 against 6.375).
        assert_eq!(share(3, 2), 2);
        assert_eq!(share(5, 4), 3);
        assert_eq!(share(17, 16), 6);
        for threads in 1..=16 {
            for images in threads..4 * threads {
                let s = share(images, threads);
                let busiest = (images * s).div_ceil(threads) as f64;
                let even = (images * s) as f64 / threads as f64;
                assert!(busiest <= even * 1.125, "{images} on {threads}: {s} parts");
                assert!(s <= threads, "{images} on {threads}: {s} parts");
            }
        }
    }

    /// The im2col + gemm and Winograd paths against candle's own conv2d (a different
    /// algorithm) on shapes the export fixtures do not all cover: strides, dilations and
    /// paddings per dim, 1x1, batches.
    #[test]
    fn conv_gemm_matches_candle_conv2d() {
        let dev = Device::Cpu;
        // (input, weight, stride, padding, dilation, whether by Winograd's algorithm)
        type Case = ([usize; 4], [usize; 4], usize, usize, usize, bool);
        let cases: [Case; 13] = [
            ([2, 3, 9, 11], [4, 3, 3, 3], 1, 1, 1, false),
            // A lone image whose product splits into tiles over the threads: bands of output
            // channels (259 x 196 pixels, the last band shorter).
            ([1, 16, 28, 28], [259, 16, 3, 3], 2, 1, 1, false),
            // Small images, several to a product (more images than threads): 3x3, and 1x1
            // with stride 2.
            ([7, 3, 6, 5], [4, 3, 3, 3], 1, 1, 1, false),
            ([5, 6, 8, 7], [3, 6, 1, 1], 2, 0, 1, false),
            // Winograd's F(2x2, 3x3) (enough pixels per image), one image per thread and one
            // image split over threads (odd output sizes too); and an image just too small
            // (13 x 14 outputs).
            ([4, 3, 16, 15], [5, 3, 3, 3], 1, 1, 1, true),
            ([1, 6, 30, 30], [4, 6, 3, 3], 1, 0, 1, true),
            ([1, 6, 29, 30], [4, 6, 3, 3], 1, 0, 1, true),
            ([1, 6, 15, 16], [4, 6, 3, 3], 1, 0, 1, false),
            ([1, 5, 10, 7], [6, 5, 3, 3], 2, 0, 1, false),
            ([1, 2, 12, 12], [3, 2, 3, 3], 1, 2, 2, false),
            ([2, 4, 6, 5], [7, 4, 1, 1], 1, 0, 1, false),
            ([1, 3, 8, 8], [2, 3, 5, 5], 3, 2, 1, false),
            // Taps wholly in the padding (dilation wider than the image, as in DeepLab).
            ([1, 2, 5, 5], [3, 2, 3, 3], 1, 6, 6, false),
        ];
        for (xs, ws, stride, pad, dil, by_winograd) in cases {
            let x = Tensor::randn(0f32, 1., xs.to_vec(), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., ws.to_vec(), &dev).unwrap();
            let p = Params {
                stride: [stride; 2],
                padding: [pad; 2],
                dilation: [dil; 2],
                groups: 1,
                act: Act::None,
            };
            let [_, c, h, wd] = xs;
            let pix = (0..2)
                .map(|i| out_len([h, wd][i], ws[2 + i], pad, stride, dil).unwrap())
                .product();
            let geometry = winograd_geometry(ws[0], [ws[2], ws[3]], &p, [c, h, wd], pix);
            assert_eq!(geometry.is_some(), by_winograd, "{xs:?} {ws:?}");
            let plain = x.conv2d(&w, pad, stride, dil, 1).unwrap();
            let b = Tensor::randn(0f32, 1., ws[0], &dev).unwrap();
            let with_bias = plain.broadcast_add(&b.reshape((1, (), 1, 1)).unwrap());
            // One thread (a batch in one product when its images are small), two (a lone
            // image's product in tiles), three (images in groups, or one at a time) and eight
            // (fewer images than threads: side by side, each on its share of the threads);
            // without a bias and with one (its planes written image by image).
            for (bias, want) in [(None, plain), (Some(&b), with_bias.unwrap())] {
                for threads in [1, 2, 3, 8] {
                    let dense = Weight::Dense(&w);
                    let got = with_threads(threads, || conv_gemm(&x, dense, bias, None, &p))
                        .unwrap()
                        .expect("fast path applies");
                    assert_eq!(got.dims(), want.dims(), "{xs:?} {ws:?}");
                    let diff = crate::ops::max_abs_diff(&got, &want);
                    assert!(
                        diff < 1e-4,
                        "{xs:?} {ws:?} stride {stride} pad {pad} dil {dil}, bias {}, \
                         {threads} threads: {diff}",
                        bias.is_some()
                    );
                }
            }
        }
    }

    /// Grouped convolutions (not depthwise) by the runtime's own kernels, against candle's
    /// grouped conv2d (one group after another): the direct kernel for few columns per group
    /// (`narrow`: 3x3 at strides 1 and 2, 1x1 read in place) and one product per image and
    /// group (small planes, wide groups), with a bias, a residual and an activation, on 1 to
    /// 8 threads.
    #[test]
    fn grouped_convs_match_candle() {
        let dev = Device::Cpu;
        // (input, weight, groups, stride, padding, whether by `narrow`)
        type Case = ([usize; 4], [usize; 4], usize, usize, usize, bool);
        let cases: [Case; 6] = [
            // RegNet's groups of 8 channels.
            ([2, 16, 20, 20], [12, 8, 3, 3], 2, 1, 1, true),
            ([1, 24, 40, 40], [24, 8, 3, 3], 3, 2, 1, true),
            ([2, 8, 16, 16], [12, 2, 1, 1], 4, 1, 0, true),
            // Too few pixels, too many columns per group (ResNeXt's wider groups).
            ([1, 32, 7, 7], [32, 16, 3, 3], 2, 1, 1, false),
            ([2, 64, 18, 18], [64, 32, 3, 3], 2, 1, 1, false),
            ([3, 12, 9, 9], [6, 4, 1, 1], 3, 2, 0, false),
        ];
        for (xs, ws, groups, stride, pad, by_narrow) in cases {
            let r = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
            let (x, w, b) = (r(&xs), r(&ws), r(&[ws[0]]));
            let p = Params {
                stride: [stride; 2],
                padding: [pad; 2],
                dilation: [1; 2],
                groups,
                act: Act::Relu,
            };
            let [_, c, h, wd] = xs;
            let pix = (0..2)
                .map(|i| out_len([h, wd][i], ws[2 + i], pad, stride, 1).unwrap())
                .product();
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f") {
                let narrow = narrow::applies(c, [ws[2], ws[3]], pix, &p);
                assert_eq!(narrow, by_narrow, "{xs:?} {ws:?}");
            }
            let _ = (c, by_narrow);
            let sum = x.conv2d(&w, pad, stride, 1, groups).unwrap();
            let sum = sum
                .broadcast_add(&b.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            let res = r(sum.dims());
            let want = (&sum + &res).unwrap().relu().unwrap();
            for threads in [1, 2, 3, 8] {
                let dense = Weight::Dense(&w);
                let got = with_threads(threads, || conv_gemm(&x, dense, Some(&b), Some(&res), &p))
                    .unwrap()
                    .expect("the grouped path applies");
                assert_eq!(got.dims(), want.dims(), "{xs:?} {ws:?}");
                let diff = crate::ops::max_abs_diff(&got, &want);
                assert!(
                    diff < 1e-4,
                    "{xs:?} {ws:?} groups {groups}, {threads} threads: {diff}"
                );
            }
        }
    }

    /// An input with no channels or no pixels (but images) is refused, as torch refuses it,
    /// and an empty batch gives an empty output.
    #[test]
    fn empty_inputs() {
        let dev = Device::Cpu;
        let p = Params {
            stride: [1; 2],
            padding: [1; 2],
            dilation: [1; 2],
            groups: 1,
            act: Act::None,
        };
        for (xs, ws) in [([2, 0, 4, 4], [3, 0, 3, 3]), ([2, 2, 0, 4], [3, 2, 1, 1])] {
            let x = Tensor::zeros(xs.to_vec(), DType::F32, &dev).unwrap();
            let w = Tensor::zeros(ws.to_vec(), DType::F32, &dev).unwrap();
            let e = conv(&x, &w, None, None, &p).unwrap_err().0;
            assert!(e.contains("empty input"), "{e}");
        }
        let x = Tensor::zeros((0, 2, 4, 4), DType::F32, &dev).unwrap();
        let w = Tensor::zeros((3, 2, 3, 3), DType::F32, &dev).unwrap();
        assert_eq!(conv(&x, &w, None, None, &p).unwrap().dims(), [0, 3, 4, 4]);
        // An empty batch in 4 groups, strided (candle's grouped conv panicked on it).
        let x = Tensor::zeros((0, 16, 8, 8), DType::F32, &dev).unwrap();
        let w = Tensor::zeros((16, 4, 3, 3), DType::F32, &dev).unwrap();
        let grouped = Params {
            stride: [2; 2],
            groups: 4,
            ..p
        };
        assert_eq!(
            conv(&x, &w, None, None, &grouped).unwrap().dims(),
            [0, 16, 4, 4]
        );
    }

    /// A residual fused at load, added before the activation, on every path: Winograd, im2col
    /// one image at a time, in groups and in bands, 1x1 read directly, depthwise and float64
    /// (added after the kernel), and a residual that only broadcasts (added after too).
    #[test]
    fn residual_is_added_before_the_activation() {
        let dev = Device::Cpu;
        // (input, weight, groups, residual's shape if not the output's, float64)
        type Case = ([usize; 4], [usize; 4], usize, Option<[usize; 4]>, bool);
        let cases: [Case; 8] = [
            ([4, 3, 16, 15], [5, 3, 3, 3], 1, None, false),
            ([2, 3, 9, 11], [4, 3, 3, 3], 1, None, false),
            ([7, 3, 6, 5], [4, 3, 3, 3], 1, None, false),
            ([1, 4, 6, 6], [259, 4, 3, 3], 1, None, false),
            ([3, 6, 5, 4], [7, 6, 1, 1], 1, None, false),
            ([2, 4, 9, 9], [4, 1, 3, 3], 4, None, false),
            ([2, 3, 7, 7], [4, 3, 3, 3], 1, None, true),
            ([2, 3, 7, 7], [4, 3, 3, 3], 1, Some([1, 4, 1, 1]), false),
        ];
        for (xs, ws, groups, rs, f64) in cases {
            let dt = if f64 { DType::F64 } else { DType::F32 };
            let randn = |s: Vec<usize>| Tensor::randn(0f32, 1., s, &dev).unwrap().to_dtype(dt);
            let (x, w) = (randn(xs.to_vec()).unwrap(), randn(ws.to_vec()).unwrap());
            let b = randn(vec![ws[0]]).unwrap();
            let sum = x
                .conv2d(&w, 1, 1, 1, groups)
                .unwrap()
                .broadcast_add(&b.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            let r = randn(rs.map_or(sum.dims().to_vec(), |r| r.to_vec())).unwrap();
            let want = sum.broadcast_add(&r).unwrap().relu().unwrap();
            let p = Params {
                stride: [1; 2],
                padding: [1; 2],
                dilation: [1; 2],
                groups,
                act: Act::Relu,
            };
            for threads in [1, 2, 3, 8] {
                let got = with_threads(threads, || conv(&x, &w, Some(&b), Some(&r), &p)).unwrap();
                assert_eq!(got.dims(), want.dims(), "{xs:?} {ws:?}");
                assert_eq!(got.dtype(), dt);
                let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                let diff = crate::ops::max_abs_diff(&f32(&got), &f32(&want));
                assert!(diff < 1e-4, "{xs:?} {ws:?} {threads} threads: {diff}");
            }
        }
    }

    /// [`WINOGRAD_TARGET`] with the weight transformed by [`winograd_weight`] computes what
    /// `aten.conv2d` computes with the weight as it is: batches of one and two, planes above
    /// and below Winograd's threshold for untransformed weights (it runs by Winograd
    /// whatever the plane), paddings 0 to 2, with and without a bias, and with a fused
    /// residual and activation; on one thread and on four. A transformed weight of the wrong
    /// length, a stride of 2 and an input of other channels are refused.
    #[test]
    fn winograd_target_computes_what_conv2d_computes() {
        use serde_json::json;
        let dev = Device::Cpu;
        // (input, output channels, padding, bias, fused residual and relu)
        let cases = [
            ([1, 16, 16, 16], 8, 1, true, false),
            ([2, 16, 9, 11], 5, 0, false, true),
            ([1, 3, 6, 5], 4, 2, true, true),
            ([2, 24, 30, 30], 40, 1, true, false),
        ];
        for (xs, co, pad, with_bias, fused) in cases {
            let x = Tensor::randn(0f32, 1., xs.to_vec(), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., (co, xs[1], 3, 3), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., co, &dev).unwrap();
            let u = winograd_weight(&w).unwrap();
            assert_eq!(u.dims(), [16 * co * xs[1]]);
            let mut args = vec![
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("padding", json!({ "as_ints": [pad, pad] })),
            ];
            if with_bias {
                args.push(("bias", json!({"as_tensor": {"name": "b"}})));
            }
            let mut tensors = vec![("x", x.clone()), ("w", w.clone()), ("b", b)];
            let run =
                |target: &str, args: &[(&str, serde_json::Value)], tensors: &[(&str, Tensor)]| {
                    super::super::run_node(register, target, args, tensors).map(|v| match &v[0] {
                        crate::value::Value::Tensor(t) => t.clone(),
                        _ => panic!("not a tensor"),
                    })
                };
            if fused {
                let plain = run("aten.conv2d.default", &args, &tensors).unwrap();
                let r = Tensor::randn(0f32, 1., plain.shape(), &dev).unwrap();
                args.push((FUSED_RESIDUAL_ARG, json!({"as_tensor": {"name": "r"}})));
                args.push((FUSED_ACT_ARG, json!({"as_string": "relu"})));
                tensors.push(("r", r));
            }
            let want = run("aten.conv2d.default", &args, &tensors).unwrap();
            tensors[1].1 = u.clone();
            let shape = [co, xs[1], 3, 3];
            args.push(("weight_shape", json!({ "as_ints": shape })));
            for threads in [1, 4] {
                let got = with_threads(threads, || run(WINOGRAD_TARGET, &args, &tensors).unwrap());
                assert_eq!(got.dims(), want.dims(), "{xs:?}");
                let (diff, scale) = crate::ops::diff_and_scale(&got, &want);
                assert!(
                    diff <= 1e-5 * scale.max(1.0),
                    "{xs:?}, {threads} threads: {diff}"
                );
            }
            // Refused: a transform of the wrong length, a stride of 2, other channels.
            let short = u.narrow(0, 0, u.elem_count() - 1).unwrap();
            let mut bad = tensors.clone();
            bad[1].1 = short;
            let err = run(WINOGRAD_TARGET, &args, &bad).unwrap_err().0;
            assert!(err.contains("does not hold"), "{err}");
            let mut strided = args.clone();
            strided.push(("stride", json!({ "as_ints": [2, 2] })));
            let err = run(WINOGRAD_TARGET, &strided, &tensors).unwrap_err().0;
            assert!(err.contains("stride"), "{err}");
            let mut other = tensors.clone();
            other[0].1 = Tensor::randn(0f32, 1., (1, xs[1] + 1, 8, 8), &dev).unwrap();
            let err = run(WINOGRAD_TARGET, &args, &other).unwrap_err().0;
            assert!(err.contains("input"), "{err}");
        }
    }

    /// Every conv node a residual can be fused onto adds it before its activation: 2-d,
    /// unbatched 1-d, and 3-d (`convolution` with a 5-d weight, its own kernel), each against
    /// the same node without the fused arguments plus the residual, then relu.
    #[test]
    fn fused_residual_reaches_every_conv_kernel() {
        use serde_json::json;
        let dev = Device::Cpu;
        // (target, input, weight, padding)
        type Case = (&'static str, Vec<usize>, Vec<usize>, Vec<i64>);
        let cases: [Case; 3] = [
            (
                "aten.conv2d.default",
                vec![2, 3, 6, 5],
                vec![4, 3, 3, 3],
                vec![1, 1],
            ),
            ("aten.conv1d.default", vec![3, 7], vec![4, 3, 3], vec![1]),
            (
                "aten.convolution.default",
                vec![1, 2, 4, 5, 5],
                vec![3, 2, 3, 3, 3],
                vec![1, 1, 1],
            ),
        ];
        for (target, xs, ws, pad) in cases {
            let x = Tensor::randn(0f32, 1., xs, &dev).unwrap();
            let w = Tensor::randn(0f32, 1., ws.clone(), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., ws[0], &dev).unwrap();
            let ones = vec![1i64; pad.len()];
            let mut args = vec![
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("bias", json!({"as_tensor": {"name": "b"}})),
                ("stride", json!({ "as_ints": ones })),
                ("padding", json!({ "as_ints": pad })),
                ("dilation", json!({ "as_ints": ones })),
                ("transposed", json!({"as_bool": false})),
                ("output_padding", json!({"as_ints": vec![0; pad.len()]})),
                ("groups", json!({"as_int": 1})),
            ];
            let mut tensors = vec![("x", x), ("w", w), ("b", b)];
            let run = |args: &[(&str, serde_json::Value)], tensors: &[(&str, Tensor)]| {
                match &super::super::run_node(register, target, args, tensors).unwrap()[0] {
                    crate::value::Value::Tensor(t) => t.clone(),
                    _ => panic!("not a tensor"),
                }
            };
            let plain = run(&args, &tensors);
            let r = Tensor::randn(0f32, 1., plain.shape(), &dev).unwrap();
            let want = (&plain + &r).unwrap().relu().unwrap();
            args.push((FUSED_RESIDUAL_ARG, json!({"as_tensor": {"name": "r"}})));
            args.push((FUSED_ACT_ARG, json!({"as_string": "relu"})));
            tensors.push(("r", r));
            let got = run(&args, &tensors);
            assert_eq!(got.dims(), want.dims(), "{target}");
            let diff = crate::ops::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{target}: {diff}");
        }
    }

    /// Depthwise convs (multiplier 1 and 2, stride, padding, dilation) and a dense conv, each
    /// with a bias, through `conv` against candle's grouped conv2d plus the bias added apart.
    #[test]
    fn conv_with_bias_matches_candle() {
        let dev = Device::Cpu;
        // (input, weight, groups, stride, padding, dilation)
        type Case = ([usize; 4], [usize; 4], usize, usize, usize, usize);
        let cases: [Case; 5] = [
            ([2, 4, 9, 9], [4, 1, 3, 3], 4, 1, 1, 1),
            // Stride 1 (the padded-plane path): multiplier 2, a non-square image.
            ([1, 3, 7, 5], [6, 1, 5, 5], 3, 1, 2, 1),
            ([1, 3, 10, 11], [6, 1, 3, 3], 3, 2, 1, 1),
            ([1, 4, 12, 12], [4, 1, 5, 5], 4, 1, 4, 2),
            ([3, 3, 8, 8], [5, 3, 3, 3], 1, 2, 1, 1),
        ];
        for (xs, ws, groups, stride, pad, dil) in cases {
            let x = Tensor::randn(0f32, 1., xs.to_vec(), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., ws.to_vec(), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., ws[0], &dev).unwrap();
            let p = Params {
                stride: [stride; 2],
                padding: [pad; 2],
                dilation: [dil; 2],
                groups,
                act: Act::None,
            };
            let got = conv(&x, &w, Some(&b), None, &p).unwrap();
            let want = x
                .conv2d(&w, pad, stride, dil, groups)
                .unwrap()
                .broadcast_add(&b.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            assert_eq!(got.dims(), want.dims(), "{xs:?} {ws:?}");
            let diff = crate::ops::max_abs_diff(&got, &want);
            assert!(diff < 1e-4, "{xs:?} {ws:?} groups {groups}: {diff}");
        }
    }

    /// A 1-d conv (run as 2-d over a height of 1) through `conv_nd`'s path against candle's
    /// conv1d: stride 2, padding 1, dilation 2.
    #[test]
    fn conv1d_matches_candle_conv1d() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 3, 20), &dev).unwrap();
        let w = Tensor::randn(0f32, 1., (4, 3, 5), &dev).unwrap();
        let p = Params {
            stride: [1, 2],
            padding: [0, 1],
            dilation: [1, 2],
            groups: 1,
            act: Act::None,
        };
        let got = conv(&x, &w, None, None, &p).unwrap();
        let want = x.conv1d(&w, 1, 2, 2, 1).unwrap();
        assert_eq!(got.dims(), want.dims());
        let diff = crate::ops::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{diff}");
    }
}
