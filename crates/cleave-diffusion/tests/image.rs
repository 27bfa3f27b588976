//! Decoded VAE output to pixels and PNG, against the pipeline's `image`, `image_uint8` and PNG files.

mod common;

use std::io::Cursor;

use cleave_diffusion::image::{denormalize, ImageError, RgbImage};

/// A PNG as the `png` crate decodes it; text chunks as `(keyword, text)`.
struct DecodedPng {
    width: u32,
    height: u32,
    color: png::ColorType,
    pixels: Vec<u8>,
    latin1_text: Vec<(String, String)>,
    utf8_text: Vec<(String, String)>,
}

fn decode_png(bytes: Vec<u8>) -> DecodedPng {
    let mut reader = png::Decoder::new(Cursor::new(bytes)).read_info().expect("png header");
    let mut pixels = vec![0; reader.output_buffer_size().expect("buffer size")];
    let frame = reader.next_frame(&mut pixels).expect("png frame");
    pixels.truncate(frame.buffer_size());
    reader.finish().expect("png trailer");
    let info = reader.info();
    DecodedPng {
        width: frame.width,
        height: frame.height,
        color: frame.color_type,
        pixels,
        latin1_text: info
            .uncompressed_latin1_text
            .iter()
            .map(|t| (t.keyword.clone(), t.text.clone()))
            .collect(),
        utf8_text: info
            .utf8_text
            .iter()
            .map(|t| (t.keyword.clone(), t.get_text().expect("itxt")))
            .collect(),
    }
}

fn decoded(p: usize) -> (Vec<f32>, usize, usize) {
    let tensor = common::tensor(&format!("p{p}.vae_decoded"));
    assert_eq!(tensor.shape[..2], [1, 3]);
    let (height, width) = (tensor.shape[2], tensor.shape[3]);
    (tensor.f32s(), height, width)
}

#[test]
fn denormalized_image_matches_np_output() {
    for p in 0..2 {
        let (values, height, width) = decoded(p);
        let expected = common::tensor(&format!("p{p}.image"));
        assert_eq!(expected.shape, [1, height, width, 3]);
        assert_eq!(
            denormalize(&values, height, width).expect("denormalize"),
            expected.f32s(),
            "p{p}"
        );
    }
}

#[test]
fn pixels_match_image_uint8_and_reference_png() {
    for p in 0..2 {
        let (values, height, width) = decoded(p);
        let image = RgbImage::from_decoded(&values, height, width).expect("image");
        assert_eq!((image.height(), image.width()), (height, width));
        let expected = common::tensor(&format!("p{p}.image_uint8")).u8s();
        let differing = image.pixels().iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "p{p}: {differing} of {} bytes differ", expected.len());

        let reference = decode_png(std::fs::read(common::fixture_dir().join(format!("image_p{p}.png"))).expect("png"));
        assert_eq!((reference.width as usize, reference.height as usize), (width, height));
        assert_eq!(reference.color, png::ColorType::Rgb);
        assert_eq!(reference.pixels, image.pixels(), "p{p}: image_p{p}.png");
    }
}

#[test]
fn written_png_round_trips_with_parameters_in_text_chunk() {
    let (values, height, width) = decoded(0);
    let image = RgbImage::from_decoded(&values, height, width).expect("image");
    let parameters = format!(
        "{}\nSteps: 4, Sampler: Euler, CFG scale: 1, Guidance: 3.5, Seed: 42",
        common::prompt(0)
    );
    let png = decode_png(image.encode_png(&parameters).expect("encode"));
    assert_eq!(
        (png.width as usize, png.height as usize, png.color),
        (width, height, png::ColorType::Rgb)
    );
    assert_eq!(png.pixels, image.pixels());
    assert_eq!(png.latin1_text, [("parameters".to_owned(), parameters)]);
    assert!(png.utf8_text.is_empty());
}

#[test]
fn non_latin1_parameters_go_to_an_itxt_chunk() {
    let (values, height, width) = decoded(1);
    let image = RgbImage::from_decoded(&values, height, width).expect("image");
    let parameters = "une écureuil 松鼠 🐿";
    let png = decode_png(image.encode_png(parameters).expect("encode"));
    assert!(png.latin1_text.is_empty());
    assert_eq!(png.utf8_text, [("parameters".to_owned(), parameters.to_owned())]);
    assert_eq!(png.pixels, image.pixels());
}

#[test]
fn write_png_creates_the_file() {
    let (values, height, width) = decoded(0);
    let image = RgbImage::from_decoded(&values, height, width).expect("image");
    let path = std::env::temp_dir().join(format!("cleave-diffusion-image-test-{}.png", std::process::id()));
    image.write_png(&path, "a squirrel").expect("write");
    let png = decode_png(std::fs::read(&path).expect("read back"));
    std::fs::remove_file(&path).expect("clean up");
    assert_eq!(png.pixels, image.pixels());
    assert_eq!(png.latin1_text, [("parameters".to_owned(), "a squirrel".to_owned())]);
}

#[test]
fn wrong_length_is_an_error() {
    let err = RgbImage::from_decoded(&[0.0; 10], 2, 2).unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::LengthMismatch {
                height: 2,
                width: 2,
                expected: 12,
                actual: 10
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "decoded image must have 3 channels of 2x2 values (12), got 10"
    );
}
