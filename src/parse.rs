//! Flag values checked as clap parses them, so that a NaN, a negative or
//! an absurd size is refused with the flag named, before anything runs.

use std::ops::RangeInclusive;

use cleave_engine::ImageSettings;

/// A finite number of at least 0 (`--temp`, `--guidance`, `--tensor-split`).
pub fn non_negative(text: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{text} must be a finite number of at least 0"))
    }
}

/// [`non_negative`], and still finite as the f32 it is used as (`--guidance`,
/// which the pipeline narrows): 1e39 is finite as f64, infinite as f32.
pub fn non_negative_within_f32(text: &str) -> Result<f64, String> {
    let value = non_negative(text)?;
    if (value as f32).is_finite() {
        Ok(value)
    } else {
        Err(format!("{text} is past the largest 32-bit float ({:e})", f32::MAX))
    }
}

/// [`non_negative_within_f32`], as the f32 the samplers take (`--temp`).
pub fn non_negative_f32(text: &str) -> Result<f32, String> {
    non_negative_within_f32(text).map(|v| v as f32)
}

/// A penalty that scales a logit (`--repeat-penalty`): a finite f32 above
/// 0, for 0 would wipe the logits out (and make -∞ times 0 a NaN).
pub fn positive_f32(text: &str) -> Result<f32, String> {
    let value = non_negative_f32(text)?;
    if value > 0.0 {
        Ok(value)
    } else {
        Err(format!("{text} must be above 0 (1 is off)"))
    }
}

/// A penalty subtracted from logits (`--presence-penalty`,
/// `--frequency-penalty`): any finite f32, negative ones favouring
/// repeats, within OpenAI's -2 to 2 or not.
pub fn finite_f32(text: &str) -> Result<f32, String> {
    let value: f32 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("{text} must be a finite 32-bit number"))
    }
}

/// A probability mass in (0, 1] (`--top-p`), judged as the f32 the sampler
/// takes: 1e-50 is 0 there.
pub fn probability(text: &str) -> Result<f32, String> {
    let value = non_negative_f32(text)?;
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else if value == 0.0 && non_negative(text)? > 0.0 {
        Err(format!(
            "{text} must be in (0, 1]: it is 0 as the 32-bit float the sampler takes"
        ))
    } else {
        Err(format!("{text} must be in (0, 1]"))
    }
}

/// A count flag's whole number, 0 or more, as the type the flag holds: a
/// negative one is named as such rather than taken for another flag (each
/// count flag lets clap pass `-1` on as its value).
pub fn count<T: TryFrom<usize>>(text: &str) -> Result<T, String> {
    let value = count_in(text, 0..=usize::MAX)?;
    T::try_from(value).map_err(|_| format!("{value} is too large"))
}

/// A whole number within `range`.
fn count_in(text: &str, range: RangeInclusive<usize>) -> Result<usize, String> {
    let negative = text.trim().parse::<i128>().ok().filter(|n| *n < 0);
    if let Some(n) = negative {
        return Err(match range.end() {
            &usize::MAX => format!("{n} is negative: give a whole number, {} or more", range.start()),
            end => format!("{n} is negative: give a whole number from {} to {end}", range.start()),
        });
    }
    let value: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number"))?;
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} is outside {}..={}", range.start(), range.end()))
    }
}

/// An image side in pixels (`-H`, `-W`): up to 16384, four times FLUX.1's
/// largest trained size, so the latents and the attention over them stay
/// far from overflowing anything. (The pipeline sets the smallest.)
pub fn image_side(text: &str) -> Result<usize, String> {
    count_in(text, 0..=16_384)
}

/// An image prompt (`-p` of `cleave image`), at most
/// [`ImageSettings::MAX_PROMPT_BYTES`] long.
pub fn image_prompt(text: &str) -> Result<String, String> {
    ImageSettings::check_prompt(text)?;
    Ok(text.to_string())
}

/// Denoising steps (`--steps`).
pub fn steps(text: &str) -> Result<usize, String> {
    match count_in(text, 0..=ImageSettings::MAX_STEPS)? {
        0 => Err("--steps must be at least 1".into()),
        n => Ok(n),
    }
}

/// T5 tokens (`--max-sequence-length`): FLUX.1's T5 takes at most 512.
pub fn t5_tokens(text: &str) -> Result<usize, String> {
    count_in(text, 1..=ImageSettings::MAX_T5_TOKENS)
}

/// Tokens a speculative step drafts at most (`--draft-max`).
pub fn draft_tokens(text: &str) -> Result<usize, String> {
    count_in(text, 1..=cleave_nn::MAX_DRAFTS)
}

/// Experts per block a device's cache keeps (`--expert-cache`).
pub fn expert_cache(text: &str) -> Result<usize, String> {
    match count_in(text, 0..=usize::MAX)? {
        0 => Err("a cache needs room for at least 1 expert of each block, the one running".into()),
        n => Ok(n),
    }
}
