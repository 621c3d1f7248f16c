//! Images in input pipelines: PNG (the `png` crate) and JPEG (`zune-jpeg`) decoding,
//! channel conversion, and the bilinear resize of `decode_png`/`decode_jpeg` with a
//! `size` (TensorFlow 2's `tf.image.resize`: half-pixel centres, no antialiasing).

use crate::elab::UNKNOWN_DIM;
use crate::ir::{DType, ImageFormat, TensorType};
use crate::tensor::Tensor;

/// The most pixels an image decoded in a pipeline may have.
const MAX_PIXELS: usize = 1 << 28;

/// A decoded image: its samples (16-bit ones as values up to 65535), height, width and
/// channel count.
pub struct Image {
    pub samples: Vec<u16>,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub sixteen: bool,
}

/// Decodes PNG bytes (palette and low bit depths expanded to 8 bits). With `expect`
/// (height, width), an image of another size is refused before its pixels are decoded;
/// without it, images over 2^28 pixels are.
pub fn decode_png(bytes: &[u8], expect: Option<(usize, usize)>) -> Result<Image, String> {
    let mut dec = png::Decoder::new(std::io::Cursor::new(bytes));
    dec.set_transformations(png::Transformations::EXPAND);
    let mut reader = dec.read_info().map_err(|e| e.to_string())?;
    let (h, w) = (reader.info().height as usize, reader.info().width as usize);
    match expect {
        Some((eh, ew)) if (eh, ew) != (h, w) => {
            return Err(format!(
                "the image is {h}x{w}, but the source reads {eh}x{ew} images"
            ))
        }
        None if h.saturating_mul(w) > MAX_PIXELS => {
            return Err(format!("the image is {h}x{w}, too large to convert"))
        }
        _ => {}
    }
    let size = reader
        .output_buffer_size()
        .ok_or("the image is too large")?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(|e| e.to_string())?;
    buf.truncate(info.buffer_size());
    let channels = info.color_type.samples();
    let sixteen = info.bit_depth == png::BitDepth::Sixteen;
    let samples = if sixteen {
        buf.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect()
    } else {
        buf.iter().map(|&b| u16::from(b)).collect()
    };
    Ok(Image {
        samples,
        height: info.height as usize,
        width: info.width as usize,
        channels,
        sixteen,
    })
}

/// How colour becomes gray.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Luma {
    /// ITU-R BT.601's weights, rounded (PIL's `convert("L")`).
    Rounded,
    /// libpng's `png_set_rgb_to_gray(0.299, 0.587)`, which TensorFlow's `decode_png`
    /// uses: the weights in 1/32768ths (9797, 19234, 3737), truncated; 8-bit samples.
    Libpng,
}

/// Converts an image's pixels to `want` channels: gray is repeated into colour, colour
/// becomes gray by its luma (see `Luma`), alpha is dropped or made opaque.
pub fn convert_channels(img: &Image, want: usize, luma: Luma) -> Vec<f64> {
    let max = if img.sixteen { 65535.0 } else { 255.0 };
    let mut out = Vec::with_capacity(img.height * img.width * want);
    for px in img.samples.chunks_exact(img.channels) {
        let (rgb, alpha) = match img.channels {
            1 => ([px[0] as f64; 3], max),
            2 => ([px[0] as f64; 3], px[1] as f64),
            3 => ([px[0] as f64, px[1] as f64, px[2] as f64], max),
            _ => ([px[0] as f64, px[1] as f64, px[2] as f64], px[3] as f64),
        };
        // libpng leaves a gray pixel of a colour image as it is
        let gray_already = rgb[0] == rgb[1] && rgb[0] == rgb[2];
        let gray = if img.channels <= 2 || (luma == Luma::Libpng && gray_already) {
            rgb[0]
        } else if luma == Luma::Libpng {
            ((9797.0 * rgb[0] + 19234.0 * rgb[1] + 3737.0 * rgb[2]) / 32768.0).floor()
        } else {
            (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]).round()
        };
        match want {
            1 => out.push(gray),
            2 => out.extend([gray, alpha]),
            3 => out.extend(rgb),
            _ => out.extend([rgb[0], rgb[1], rgb[2], alpha]),
        }
    }
    out
}

/// A PNG's height and width, from its header.
fn png_size(bytes: &[u8]) -> Result<(usize, usize), String> {
    let reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .map_err(|e| e.to_string())?;
    Ok((reader.info().height as usize, reader.info().width as usize))
}

/// Refuses an image of `got` size where the type reads `want` (open dimensions take
/// any size).
fn wrong_size((h, w): (usize, usize), (ih, iw): (usize, usize)) -> Result<(), String> {
    let fits = |want: usize, got: usize| want == UNKNOWN_DIM || want == got;
    if fits(h, ih) && fits(w, iw) {
        return Ok(());
    }
    // (a size each image gives prints `?`, and the image's own fills it in the help)
    let show = |d: usize| {
        if d == UNKNOWN_DIM {
            "?".to_string()
        } else {
            d.to_string()
        }
    };
    let or = |d: usize, own: usize| if d == UNKNOWN_DIM { own } else { d };
    Err(format!(
        "the image is {ih}x{iw}, but the pipeline reads {}x{} images: give `size: [{}, {}]` to resize them",
        show(h),
        show(w),
        or(h, ih),
        or(w, iw)
    ))
}

/// Decodes JPEG bytes to 8-bit samples: luma alone for `channels` 1 (the Y of YCbCr,
/// as libjpeg's grayscale output that TensorFlow's `decode_jpeg(channels=1)` reads), RGB
/// otherwise. Images over 2^28 pixels are refused after the headers.
pub fn decode_jpeg(bytes: &[u8], channels: usize) -> Result<Image, String> {
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let out = if channels == 1 {
        ColorSpace::Luma
    } else {
        ColorSpace::RGB
    };
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(out)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16);
    let mut dec = zune_jpeg::JpegDecoder::new_with_options(std::io::Cursor::new(bytes), options);
    dec.decode_headers().map_err(|e| e.to_string())?;
    let info = dec.info().ok_or("no image in the JPEG headers")?;
    let (h, w) = (info.height as usize, info.width as usize);
    if h.saturating_mul(w) > MAX_PIXELS {
        return Err(format!("the image is {h}x{w}, too large to decode"));
    }
    let pixels = dec.decode().map_err(|e| e.to_string())?;
    let got = dec.output_colorspace().map_or(3, |c| c.num_components());
    if pixels.len() != h * w * got {
        return Err(format!(
            "the JPEG decoded to {} bytes, not {h}x{w}x{got}",
            pixels.len()
        ));
    }
    Ok(Image {
        samples: pixels.into_iter().map(u16::from).collect(),
        height: h,
        width: w,
        channels: got,
        sixteen: false,
    })
}

/// `decode_png`/`decode_jpeg` in a pipeline: `bytes` (one encoded image) to a tensor of
/// `ty` `[height, width, channels]`. Without `resize`, u8 of the image's own size,
/// which must be `ty`'s where `ty` fixes it (of 16-bit PNG samples, the high byte);
/// with it, f32 resized to `ty`'s height and width.
pub fn decode(
    bytes: &Tensor,
    format: ImageFormat,
    resize: bool,
    ty: &TensorType,
) -> Result<Tensor, String> {
    let [h, w, c] = ty.shape[..] else {
        return Err(format!(
            "a decoded image is [height, width, channels], not {ty}"
        ));
    };
    let data = match bytes.s().iter().next() {
        Some(b) if bytes.shape().is_empty() => b.clone(),
        _ => return Err("decodes one image (a scalar of bytes)".into()),
    };
    let mut img = match format {
        ImageFormat::Png => {
            // a size the type fixes refuses another before the pixels are decoded
            if let (false, Ok(size)) = (resize, png_size(&data)) {
                wrong_size((h, w), size)?;
            }
            decode_png(&data, None)
        }
        ImageFormat::Jpeg => decode_jpeg(&data, c),
    }
    .map_err(|m| format!("not a readable {} ({m})", format.name()))?;
    if img.sixteen {
        // TensorFlow's `decode_png` to uint8 keeps a 16-bit sample's high byte
        // (libpng's `png_set_strip_16`)
        img.samples.iter_mut().for_each(|x| *x >>= 8);
        img.sixteen = false;
    }
    let v = convert_channels(&img, c, Luma::Libpng);
    let (ih, iw) = (img.height, img.width);
    if resize {
        let out = resize_bilinear(&v, [ih, iw, c], [h, w]);
        return Ok(Tensor::from_f64(
            &TensorType::new(DType::F32, vec![h, w, c]),
            out,
        ));
    }
    wrong_size((h, w), (ih, iw))?;
    Ok(Tensor::from_f64(
        &TensorType::new(DType::U8, vec![ih, iw, c]),
        v,
    ))
}

/// Bilinear resize of an `[h, w, c]` image to `[oh, ow, c]`, one axis after the other
/// (height first), with TensorFlow 2's weights: the source of output pixel `i` is
/// `(i + 0.5) * len / out - 0.5`, between its floor (at least 0) and the next pixel (at
/// most the last). Computed in f32 steps, as the `resize` of the model's graphs.
pub fn resize_bilinear(v: &[f64], [h, w, c]: [usize; 3], [oh, ow]: [usize; 2]) -> Vec<f64> {
    // (lower, upper, weight of upper) for each output index along an axis
    let weights = |out: usize, len: usize| -> Vec<(usize, usize, f32)> {
        let scale = len as f32 / out as f32;
        (0..out)
            .map(|i| {
                let src = (i as f32 + 0.5) * scale - 0.5;
                let fl = src.floor();
                let lower = fl.max(0.0) as usize;
                let upper = ((fl + 1.0).min((len - 1) as f32)).max(0.0) as usize;
                (lower, upper, src - fl)
            })
            .collect()
    };
    let lerp = |a: f64, b: f64, t: f32| -> f64 {
        let (a, b) = (a as f32, b as f32);
        f64::from(a * (1.0 - t) + b * t)
    };
    // along the height
    let mut mid = vec![0.0; oh * w * c];
    if oh == h {
        mid.copy_from_slice(v);
    } else {
        for (i, &(lo, hi, t)) in weights(oh, h).iter().enumerate() {
            for k in 0..w * c {
                mid[i * w * c + k] = lerp(v[lo * w * c + k], v[hi * w * c + k], t);
            }
        }
    }
    if ow == w {
        return mid;
    }
    let mut out = vec![0.0; oh * ow * c];
    let wts = weights(ow, w);
    for i in 0..oh {
        for (j, &(lo, hi, t)) in wts.iter().enumerate() {
            for k in 0..c {
                out[(i * ow + j) * c + k] =
                    lerp(mid[(i * w + lo) * c + k], mid[(i * w + hi) * c + k], t);
            }
        }
    }
    out
}
