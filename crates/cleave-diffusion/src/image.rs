//! From the VAE decoder's output to an 8-bit RGB PNG, rounding exactly as diffusers does, with the
//! generation parameters embedded in a `parameters` text chunk (the A1111 / stable-diffusion.cpp
//! convention that image viewers and UIs read back).

use std::io::Write;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("decoded image must have 3 channels of {height}x{width} values ({expected}), got {actual}")]
    LengthMismatch {
        height: usize,
        width: usize,
        expected: usize,
        actual: usize,
    },
    #[error("image side {0} does not fit in a PNG header")]
    TooLarge(usize),
    #[error("cannot encode PNG: {0}")]
    Encode(#[from] png::EncodingError),
    /// The reason is the source, which error chains print after this.
    #[error("cannot write {path}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

const CHANNELS: usize = 3;
/// Keyword under which A1111 and stable-diffusion.cpp store the generation settings.
const PARAMETERS_KEYWORD: &str = "parameters";

/// `VaeImageProcessor.postprocess(output_type="np")`: decoded `[3, H, W]` values in about [-1, 1]
/// become `(x/2 + 0.5).clamp(0, 1)` in `[H, W, 3]` order, in f32.
pub fn denormalize(decoded: &[f32], height: usize, width: usize) -> Result<Vec<f32>, ImageError> {
    let plane = height * width;
    if decoded.len() != CHANNELS * plane {
        return Err(ImageError::LengthMismatch {
            height,
            width,
            expected: CHANNELS * plane,
            actual: decoded.len(),
        });
    }
    Ok((0..plane)
        .flat_map(|pixel| (0..CHANNELS).map(move |c| c * plane + pixel))
        .map(|index| (decoded[index] / 2.0 + 0.5).clamp(0.0, 1.0))
        .collect())
}

/// An 8-bit RGB image, rows top to bottom, channels interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl RgbImage {
    /// What `output_type="pil"` yields for a decoded `[3, H, W]` tensor: [`denormalize`], then
    /// `numpy_to_pil`'s `(x * 255).round()`, where numpy rounds half to even and `x * 255` is f32.
    pub fn from_decoded(decoded: &[f32], height: usize, width: usize) -> Result<Self, ImageError> {
        let pixels = denormalize(decoded, height, width)?
            .into_iter()
            // In [0, 255] after the clamp; a NaN (which survives the clamp) becomes 0.
            .map(|x| (x * 255.0).round_ties_even() as u8)
            .collect();
        Ok(Self { width, height, pixels })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// Interleaved RGB bytes, `height · width · 3` of them.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Encodes as an 8-bit RGB PNG carrying `parameters`. The text goes into a `tEXt` chunk, which
    /// holds Latin-1 only; other text (a prompt in another script) goes into a UTF-8 `iTXt` chunk
    /// under the same keyword, as Pillow does for A1111.
    pub fn encode_png(&self, parameters: &str) -> Result<Vec<u8>, ImageError> {
        let mut out = Vec::new();
        self.write_png_to(&mut out, parameters)?;
        Ok(out)
    }

    /// [`encode_png`](Self::encode_png) into a file.
    pub fn write_png(&self, path: &Path, parameters: &str) -> Result<(), ImageError> {
        let bytes = self.encode_png(parameters)?;
        std::fs::write(path, bytes).map_err(|source| ImageError::Write {
            path: path.into(),
            source,
        })
    }

    fn write_png_to<W: Write>(&self, sink: W, parameters: &str) -> Result<(), ImageError> {
        let side = |v: usize| u32::try_from(v).map_err(|_| ImageError::TooLarge(v));
        let mut encoder = png::Encoder::new(sink, side(self.width)?, side(self.height)?);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let (keyword, text) = (PARAMETERS_KEYWORD.to_owned(), parameters.to_owned());
        if parameters.chars().all(|c| u32::from(c) <= 0xff) {
            encoder.add_text_chunk(keyword, text)?;
        } else {
            encoder.add_itxt_chunk(keyword, text)?;
        }
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&self.pixels)?;
        writer.finish()?;
        Ok(())
    }
}
