//! A generation request's sampling values and token budget, checked as the
//! engine takes them: the values narrowed to the f32 the sampler uses
//! before they are judged (a `top_p` of 1e-50 is 0 there, a `temperature`
//! of 1e39 infinite), each error naming the value as it was sent, and the
//! prompt plus `max_tokens` compared without a sum that could wrap.

use cleave_engine::Penalties;

use crate::api::ApiError;

/// Sampling defaults: `cleave run`'s (and llama.cpp's).
const DEFAULT_TEMPERATURE: f64 = 0.8;
const DEFAULT_TOP_P: f64 = 0.95;

/// The sampler's values, checked.
#[derive(Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
}

/// `temperature` in [0, 2] and `top_p` in (0, 1], each as the f32 the
/// sampler takes.
pub fn sampling(temperature: Option<f64>, top_p: Option<f64>) -> Result<Sampling, ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let sent_temperature = temperature.unwrap_or(DEFAULT_TEMPERATURE);
    let temperature = sent_temperature as f32;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(invalid(
            format!("temperature {} is not between 0 and 2", as_sent(sent_temperature)),
            "temperature",
        ));
    }
    let sent_top_p = top_p.unwrap_or(DEFAULT_TOP_P);
    let top_p = sent_top_p as f32;
    if !(top_p > 0.0 && top_p <= 1.0) {
        let narrowed = if sent_top_p > 0.0 && top_p == 0.0 {
            " (it is 0 as the 32-bit float the sampler takes)"
        } else {
            ""
        };
        return Err(invalid(
            format!("top_p {} is not in (0, 1]{narrowed}", as_sent(sent_top_p)),
            "top_p",
        ));
    }
    Ok(Sampling { temperature, top_p })
}

/// The penalties a request asks for: `presence_penalty` and
/// `frequency_penalty` in [-2, 2] (OpenAI's range), `repeat_penalty` above
/// 0, each as the f32 the sampler takes; llama.cpp's defaults for what is
/// not sent.
pub fn penalties(
    presence: Option<f64>,
    frequency: Option<f64>,
    repeat: Option<f64>,
    last_n: Option<usize>,
) -> Result<Penalties, ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let defaults = Penalties::default();
    let within = |sent: Option<f64>, field: &str| match sent {
        None => Ok(0.0),
        Some(value) if (-2.0..=2.0).contains(&value) => Ok(value as f32),
        Some(value) => Err(invalid(
            format!("{field} {} is not between -2 and 2", as_sent(value)),
            field,
        )),
    };
    let repeat = match repeat {
        None => defaults.repeat,
        Some(value) if value > 0.0 && (value as f32) > 0.0 && (value as f32).is_finite() => value as f32,
        Some(value) => {
            return Err(invalid(
                format!(
                    "repeat_penalty {} is not a finite number above 0 (1 is off)",
                    as_sent(value)
                ),
                "repeat_penalty",
            ))
        }
    };
    Ok(Penalties {
        repeat,
        frequency: within(frequency, "frequency_penalty")?,
        presence: within(presence, "presence_penalty")?,
        last_n: last_n.unwrap_or(defaults.last_n),
    })
}

/// A number as the client most likely wrote it (`1e-50`, not fifty
/// digits): JSON's reader gets a float to within an ulp or so, so it is
/// shown at 15 significant digits, in JSON's shortest form.
pub(crate) fn as_sent(value: f64) -> String {
    let rounded = format!("{value:.14e}").parse().unwrap_or(value);
    serde_json::Number::from_f64(rounded).map_or_else(|| value.to_string(), |n| n.to_string())
}

/// How many tokens a request may generate: `max_tokens` when given, else
/// what the context has left after the prompt. `prompt_field` names the
/// field that carried the prompt, for the error when it fills the context.
pub fn max_new_tokens(
    prompt_tokens: usize,
    context: usize,
    max_tokens: Option<usize>,
    prompt_field: &str,
) -> Result<usize, ApiError> {
    let room = context.saturating_sub(prompt_tokens);
    if room == 0 {
        return Err(ApiError::invalid(
            format!("the prompt is {prompt_tokens} tokens, but this model's context holds {context}"),
            Some(prompt_field.into()),
        )
        .with_code("context_length_exceeded"));
    }
    match max_tokens {
        None => Ok(room),
        Some(0) => Err(ApiError::invalid(
            "max_tokens is 0: a completion takes at least 1 token",
            Some("max_tokens".into()),
        )),
        Some(max) if max <= room => Ok(max),
        Some(max) => Err(ApiError::invalid(
            format!(
                "max_tokens is {max}: with the prompt's {prompt_tokens} tokens that passes the context of {context} (at most {room})"
            ),
            Some("max_tokens".into()),
        )
        .with_code("context_length_exceeded")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_judged_as_the_sampler_takes_them_and_named_as_sent() {
        assert_eq!(
            sampling(None, None).unwrap(),
            Sampling {
                temperature: 0.8,
                top_p: 0.95
            }
        );
        // As serde_json reads "1e-50", off by an ulp.
        let top_p = sampling(None, Some(9.999999999999999e-51)).unwrap_err();
        assert_eq!(top_p.param.as_deref(), Some("top_p"));
        assert_eq!(
            top_p.message,
            "top_p 1e-50 is not in (0, 1] (it is 0 as the 32-bit float the sampler takes)"
        );
        let hot = sampling(Some(1e39), None).unwrap_err();
        assert_eq!(hot.param.as_deref(), Some("temperature"));
        assert_eq!(hot.message, "temperature 1e+39 is not between 0 and 2");
        assert_eq!(
            sampling(Some(-0.5), None).unwrap_err().message,
            "temperature -0.5 is not between 0 and 2"
        );
        assert_eq!(
            sampling(None, Some(1.5)).unwrap_err().message,
            "top_p 1.5 is not in (0, 1]"
        );
    }

    #[test]
    fn max_tokens_past_the_context_is_refused_whatever_its_size() {
        assert_eq!(max_new_tokens(10, 100, None, "prompt").unwrap(), 90);
        assert_eq!(max_new_tokens(10, 100, Some(90), "prompt").unwrap(), 90);
        let none = max_new_tokens(10, 100, Some(0), "prompt").unwrap_err();
        assert_eq!(none.param.as_deref(), Some("max_tokens"));
        assert_eq!(none.code, None, "nothing to do with the context");
        assert!(none.message.contains("at least 1 token"), "{}", none.message);
        for max in [91, 1 << 40, usize::MAX - 5, usize::MAX] {
            let err = max_new_tokens(10, 100, Some(max), "prompt").unwrap_err();
            assert_eq!(err.param.as_deref(), Some("max_tokens"), "{max}");
            assert_eq!(err.code, Some("context_length_exceeded"));
            assert!(
                err.message.starts_with(&format!("max_tokens is {max}:")),
                "{}",
                err.message
            );
        }
        let full = max_new_tokens(100, 100, Some(1), "messages").unwrap_err();
        assert_eq!(full.param.as_deref(), Some("messages"));
        assert!(full.message.contains("context holds 100"), "{}", full.message);
    }
}
