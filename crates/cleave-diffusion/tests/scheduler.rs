//! The flow-matching schedule and Euler steps against the values diffusers recorded.

mod common;

use cleave_diffusion::scheduler::{calculate_shift, guidance_input, Schedule, SchedulerConfig, Shifting};

const TOL: f32 = 1e-6;

fn config() -> SchedulerConfig {
    SchedulerConfig::from_file(&common::fixture_dir().join("scheduler/scheduler_config.json")).expect("config")
}

fn derived(key: &str) -> serde_json::Value {
    common::reference_json()["derived"][key].clone()
}

fn fixture_schedule() -> Schedule {
    let call = &common::reference_json()["pipeline_call"];
    let steps = call["num_inference_steps"].as_u64().expect("steps") as usize;
    let image_seq_len = derived("image_seq_len").as_u64().expect("image_seq_len") as usize;
    config().schedule(steps, image_seq_len).expect("schedule")
}

#[test]
fn mu_matches_reference() {
    let Shifting::Dynamic {
        base_shift,
        max_shift,
        base_image_seq_len,
        max_image_seq_len,
    } = config().shifting
    else {
        panic!("FLUX.1-dev config uses dynamic shifting");
    };
    let image_seq_len = derived("image_seq_len").as_u64().expect("image_seq_len") as usize;
    let mu = calculate_shift(
        image_seq_len,
        base_image_seq_len,
        max_image_seq_len,
        base_shift,
        max_shift,
    );
    let expected = derived("mu").as_f64().expect("mu");
    assert!((mu - expected).abs() < 1e-12, "mu {mu} vs {expected}");
}

#[test]
fn sigmas_and_timesteps_match_reference() {
    let schedule = fixture_schedule();
    for p in 0..2 {
        let sigmas = common::tensor(&format!("p{p}.sigmas")).f32s();
        let timesteps = common::tensor(&format!("p{p}.timesteps")).f32s();
        let d_sigma = common::max_abs_diff(schedule.sigmas(), &sigmas);
        let d_t = common::max_abs_diff(schedule.timesteps(), &timesteps);
        assert!(d_sigma <= TOL, "sigmas {:?} vs {sigmas:?}", schedule.sigmas());
        assert!(
            d_t <= TOL * 1000.0,
            "timesteps {:?} vs {timesteps:?}",
            schedule.timesteps()
        );
        assert_eq!(schedule.sigmas(), sigmas.as_slice(), "sigmas are bit-exact");
        assert_eq!(schedule.timesteps(), timesteps.as_slice(), "timesteps are bit-exact");
    }
}

#[test]
fn transformer_conditioning_matches_reference() {
    let schedule = fixture_schedule();
    let scale = common::reference_json()["pipeline_call"]["guidance_scale"]
        .as_f64()
        .expect("guidance_scale");
    for p in 0..2 {
        let expected = common::tensor(&format!("p{p}.transformer_timestep_input")).f32s();
        let got: Vec<f32> = (0..schedule.num_steps())
            .map(|i| schedule.transformer_timestep(i).expect("in range"))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(
            vec![guidance_input(scale)],
            common::tensor(&format!("p{p}.guidance")).f32s()
        );
    }
}

#[test]
fn euler_steps_match_reference_latents() {
    let schedule = fixture_schedule();
    for p in 0..2 {
        let mut latents = common::tensor(&format!("p{p}.initial_latents")).f32s();
        for k in 0..schedule.num_steps() {
            let velocity = common::tensor(&format!("p{p}.noise_pred.step{k}")).f32s();
            // Restart each step from the recorded latents so one step's error cannot hide in the next.
            let mut stepped = latents.clone();
            schedule.step(k, &mut stepped, &velocity).expect("step");
            let expected = common::tensor(&format!("p{p}.latents.step{k}")).f32s();
            let diff = common::max_abs_diff(&stepped, &expected);
            assert!(diff <= TOL, "p{p} step {k}: max diff {diff}");
            assert_eq!(stepped, expected, "p{p} step {k} is bit-exact");
            latents = expected;
        }
    }
}
