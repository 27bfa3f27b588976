//! Packing, position ids and VAE rescaling against the tensors diffusers recorded.

mod common;

use cleave_diffusion::latents::{image_ids, pack, text_ids, unpack, LatentShape, LatentsError, VaeLatentConfig};

fn vae_config() -> VaeLatentConfig {
    VaeLatentConfig::from_file(&common::fixture_dir().join("vae/config.json")).expect("vae config")
}

/// The latent shape derived from the pipeline call's image size, checked against the fixture.
fn fixture_shape() -> LatentShape {
    let reference = common::reference_json();
    let call = &reference["pipeline_call"];
    let size = |key: &str| call[key].as_u64().expect("image size") as usize;
    let shape = vae_config().latent_shape(size("height"), size("width")).expect("shape");
    let derived = &reference["derived"];
    let expect = |key: &str| derived[key].as_u64().expect(key) as usize;
    assert_eq!(vae_config().vae_scale_factor(), expect("vae_scale_factor"));
    assert_eq!((shape.channels(), shape.height(), shape.width()), (16, 4, 4));
    assert_eq!(shape.seq_len(), expect("image_seq_len"));
    assert_eq!(shape.packed_channels(), expect("packed_channels"));
    shape
}

#[test]
fn pack_matches_initial_latents_and_unpack_inverts_it() {
    let shape = fixture_shape();
    for p in 0..2 {
        let unpacked = common::tensor(&format!("p{p}.initial_latents_unpacked")).f32s();
        let packed = common::tensor(&format!("p{p}.initial_latents"));
        assert_eq!(packed.shape, [1, shape.seq_len(), shape.packed_channels()]);
        let packed = packed.f32s();
        assert_eq!(pack(shape, &unpacked).expect("pack"), packed);
        assert_eq!(unpack(shape, &packed).expect("unpack"), unpacked);
    }
}

#[test]
fn position_ids_match_reference() {
    let shape = fixture_shape();
    for p in 0..2 {
        let image = common::tensor(&format!("p{p}.latent_image_ids")).f32s();
        assert_eq!(image_ids(shape).concat(), image);
        let text = common::tensor(&format!("p{p}.text_ids"));
        assert_eq!(text_ids(text.shape[0]).concat(), text.f32s());
    }
}

#[test]
fn final_latents_rescale_to_vae_input() {
    let shape = fixture_shape();
    for p in 0..2 {
        let final_latents = common::tensor(&format!("p{p}.latents.step3")).f32s();
        let mut vae_input = unpack(shape, &final_latents).expect("unpack");
        vae_config().to_vae_input(&mut vae_input);
        let expected = common::tensor(&format!("p{p}.vae_input")).f32s();
        let diff = common::max_abs_diff(&vae_input, &expected);
        assert_eq!(vae_input, expected, "p{p}: max diff {diff}");
    }
}

#[test]
fn wrong_lengths_and_odd_grids_are_errors() {
    let shape = fixture_shape();
    for err in [
        pack(shape, &[0.0; 3]).unwrap_err(),
        unpack(shape, &[0.0; 3]).unwrap_err(),
    ] {
        assert!(
            matches!(
                err,
                LatentsError::LengthMismatch {
                    expected: 256,
                    actual: 3
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "expected 256 latent values for this shape, got 3");
    }
    let err = LatentShape::new(16, 3, 4).unwrap_err();
    assert!(
        matches!(
            err,
            LatentsError::InvalidShape {
                channels: 16,
                height: 3,
                width: 4
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("16x3x4"), "{err}");
    for (channels, height, width) in [(0, 4, 4), (16, 0, 4), (16, 4, 5)] {
        assert!(
            matches!(
                LatentShape::new(channels, height, width),
                Err(LatentsError::InvalidShape { .. })
            ),
            "{channels}x{height}x{width}"
        );
    }
    let err = vae_config().latent_shape(8, 32).unwrap_err();
    assert!(
        matches!(
            err,
            LatentsError::ImageTooSmall {
                height: 8,
                width: 32,
                vae_scale_factor: 8
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("image 8x32 is too small"), "{err}");
}
