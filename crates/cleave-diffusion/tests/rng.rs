//! `TorchRng` against the noise diffusers drew with `torch.Generator("cpu").manual_seed(42 + i)`.

mod common;

use cleave_diffusion::rng::TorchRng;

fn check_seed(index: usize) {
    let expected = common::tensor(&format!("p{index}.initial_latents_unpacked"));
    assert_eq!(expected.shape, [1, 16, 4, 4]);
    let expected = expected.f32s();
    let seed = common::reference_json()["prompts"][index]["latents_seed"]
        .as_u64()
        .expect("latents_seed");
    let got = TorchRng::new(seed).randn(expected.len());
    let mismatches: Vec<_> = got
        .iter()
        .zip(&expected)
        .enumerate()
        .filter(|(_, (g, e))| g.to_bits() != e.to_bits())
        .map(|(i, (g, e))| (i, *g, *e))
        .collect();
    assert!(
        mismatches.is_empty(),
        "seed {seed}: {} of 256 differ: {mismatches:?}",
        mismatches.len()
    );
}

#[test]
fn seed_42_matches_p0_noise_bit_for_bit() {
    check_seed(0);
}

#[test]
fn seed_43_matches_p1_noise_bit_for_bit() {
    check_seed(1);
}

/// `tests/fixtures/torch_randn.json`: one seed, then consecutive `torch.randn(n)` draws from
/// torch's default CPU generator (torch_randn.txt gives the script and the torch version).
#[derive(serde::Deserialize)]
struct TorchDraws {
    draws: Vec<Draws>,
}

#[derive(serde::Deserialize)]
struct Draws {
    seed: u64,
    sizes: Vec<usize>,
    values: Vec<Vec<f64>>,
}

fn torch_draws() -> Vec<Draws> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_randn.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<TorchDraws>(&text).unwrap().draws
}

/// Replays every recorded sequence of draws on one `TorchRng` per seed; each value must have
/// torch's bits. Returns the sizes checked.
fn check_torch_draws(which: impl Fn(&[usize]) -> bool) -> usize {
    let mut checked = 0;
    for draws in torch_draws().iter().filter(|d| which(&d.sizes)) {
        let mut rng = TorchRng::new(draws.seed);
        assert_eq!(draws.sizes.len(), draws.values.len());
        for (k, (&n, want)) in draws.sizes.iter().zip(&draws.values).enumerate() {
            assert_eq!(want.len(), n);
            let got = rng.randn(n);
            assert_eq!(got.len(), n, "seed {}, draw {k}: length", draws.seed);
            for (i, (g, &w)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    (w as f32).to_bits(),
                    "seed {}, draw {k} of sizes {:?}: element {i} is {g}, torch drew {w}",
                    draws.seed,
                    draws.sizes
                );
            }
            checked += 1;
        }
    }
    checked
}

/// Below 16 elements torch draws one double Box–Muller pair per two samples and caches the second
/// in the generator; consecutive small draws therefore continue one stream (`randn(1)` then
/// `randn(2)` is `randn(3)`), and a 16-wide draw in between leaves the cache alone. Checked against
/// torch's own values.
#[test]
fn small_draws_share_the_cached_sample() {
    assert!(check_torch_draws(|sizes| sizes.iter().any(|&n| n < 16)) >= 8);
    let mut split = TorchRng::new(7);
    let mut joined = TorchRng::new(7);
    let mut pieces = split.randn(1);
    pieces.extend(split.randn(2));
    assert_eq!(pieces, joined.randn(3));
}

/// 16 values, and 37 (two 16-wide chunks, then the last 16 redrawn), are torch's bit for bit.
#[test]
fn draws_of_16_and_of_a_length_not_a_multiple_of_16_match_torch() {
    assert!(check_torch_draws(|sizes| sizes.iter().any(|&n| n >= 16 && n % 16 != 0)) >= 2);
    assert!(check_torch_draws(|sizes| sizes == [16]) == 1);
}
