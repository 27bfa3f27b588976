//! A generation request's sampling values and token budget, checked as the
//! engine takes them: the values narrowed to the f32 the sampler uses
//! before they are judged (a `top_p` of 1e-50 is 0 there, a `temperature`
//! of 1e39 infinite), each error naming the value as it was sent, and the
//! prompt plus `max_tokens` compared without a sum that could wrap.

use std::collections::BTreeMap;

use cleave_engine::Penalties;
use cleave_nn::MAX_TOP_LOGPROBS;
use serde_json::Value;

use crate::api::ApiError;
use crate::routes::Endpoint;

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

/// How many alternatives' log-probabilities each token reports (`None`:
/// no log-probabilities): a completion's `logprobs` is that count, a
/// chat's `logprobs` is a bool and `top_logprobs` the count (which, as
/// OpenAI has it, needs `logprobs: true`). At most [`MAX_TOP_LOGPROBS`].
pub fn logprobs(endpoint: Endpoint, logprobs: Option<Value>, top: Option<usize>) -> Result<Option<usize>, ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let within = |count: u64, field: &str| match usize::try_from(count) {
        Ok(n) if n <= MAX_TOP_LOGPROBS => Ok(Some(n)),
        _ => Err(invalid(
            format!("{field} is {count}: at most {MAX_TOP_LOGPROBS} alternatives a token"),
            field,
        )),
    };
    let logprobs = logprobs.filter(|v| !v.is_null());
    match (endpoint, logprobs) {
        (Endpoint::Completion, _) if top.is_some() => Err(invalid(
            "top_logprobs is the chat API's: a completion takes 'logprobs': N".into(),
            "top_logprobs",
        )),
        (Endpoint::Completion, None) => Ok(None),
        (Endpoint::Completion, Some(Value::Number(n))) if n.as_u64().is_some() => {
            within(n.as_u64().unwrap_or(u64::MAX), "logprobs")
        }
        (Endpoint::Completion, Some(other)) => Err(invalid(
            format!("logprobs is {other}: a completion takes a count from 0 to {MAX_TOP_LOGPROBS}"),
            "logprobs",
        )),
        (Endpoint::Chat, None | Some(Value::Bool(false))) => match top {
            Some(n) if n > 0 => Err(invalid("top_logprobs needs 'logprobs': true".into(), "top_logprobs")),
            _ => Ok(None),
        },
        (Endpoint::Chat, Some(Value::Bool(true))) => within(top.unwrap_or(0) as u64, "top_logprobs"),
        (Endpoint::Chat, Some(other)) => Err(invalid(
            format!("logprobs is {other}: a chat takes true or false (and 'top_logprobs': N)"),
            "logprobs",
        )),
    }
}

/// Most ids one request may bias.
const MAX_BIASED: usize = 1024;

/// A request's `logit_bias`: token ids of the vocabulary (written as
/// decimal strings, as OpenAI's are), each biased by a value in [-100,
/// 100], at most [`MAX_BIASED`] of them.
pub fn logit_bias(bias: Option<BTreeMap<String, f64>>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let invalid = |message: String| Err(ApiError::invalid(message, Some("logit_bias".into())));
    let bias = bias.unwrap_or_default();
    if bias.len() > MAX_BIASED {
        return invalid(format!("logit_bias holds {} ids: at most {MAX_BIASED}", bias.len()));
    }
    let mut biased = Vec::with_capacity(bias.len());
    for (key, value) in bias {
        let id = match key.parse::<u32>() {
            Ok(id) if (id as usize) < vocab => id,
            Ok(id) => {
                return invalid(format!(
                    "logit_bias names token {id}, outside the vocabulary (size {vocab})"
                ))
            }
            Err(_) => return invalid(format!("logit_bias key {key:?} is not a token id")),
        };
        if !(-100.0..=100.0).contains(&value) {
            return invalid(format!(
                "logit_bias of token {id} is {}: not between -100 and 100",
                as_sent(value)
            ));
        }
        biased.push((id, value as f32));
    }
    Ok(biased)
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
    fn logprobs_are_a_count_in_completions_and_a_switch_in_chats() {
        use serde_json::json;
        let completion = |v: Value| logprobs(Endpoint::Completion, Some(v), None);
        assert_eq!(completion(json!(5)).unwrap(), Some(5));
        assert_eq!(completion(json!(0)).unwrap(), Some(0));
        assert_eq!(completion(Value::Null).unwrap(), None);
        for (sent, says) in [
            (json!(21), "logprobs is 21: at most 20"),
            (json!(true), "a completion takes a count"),
            (json!(-1), "a completion takes a count"),
            (json!(1e30), "a completion takes a count"),
        ] {
            let err = completion(sent).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("logprobs"));
            assert!(err.message.contains(says), "{}", err.message);
        }
        assert!(logprobs(Endpoint::Completion, None, Some(2)).is_err());
        let chat = |v: Option<Value>, top| logprobs(Endpoint::Chat, v, top);
        assert_eq!(chat(Some(json!(true)), None).unwrap(), Some(0));
        assert_eq!(chat(Some(json!(true)), Some(3)).unwrap(), Some(3));
        assert_eq!(chat(Some(json!(false)), Some(0)).unwrap(), None);
        let top = chat(Some(json!(true)), Some(100)).unwrap_err();
        assert_eq!(top.param.as_deref(), Some("top_logprobs"));
        assert!(top.message.contains("top_logprobs is 100"), "{}", top.message);
        let alone = chat(None, Some(2)).unwrap_err();
        assert!(alone.message.contains("needs 'logprobs': true"), "{}", alone.message);
        assert!(chat(Some(json!(3)), None).is_err());
    }

    #[test]
    fn logit_bias_names_ids_outside_the_vocabulary_and_values_out_of_range() {
        let bias =
            |pairs: &[(&str, f64)]| logit_bias(Some(pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()), 100);
        assert_eq!(bias(&[("5", -100.0), ("7", 2.5)]).unwrap(), [(5, -100.0), (7, 2.5)]);
        assert_eq!(logit_bias(None, 100).unwrap(), []);
        for (pairs, says) in [
            (&[("100", 1.0)][..], "token 100, outside the vocabulary (size 100)"),
            (&[("x", 1.0)][..], "key \"x\" is not a token id"),
            (&[("-1", 1.0)][..], "is not a token id"),
            (&[("3", 100.5)][..], "token 3 is 100.5: not between -100 and 100"),
        ] {
            let err = bias(pairs).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("logit_bias"));
            assert!(err.message.contains(says), "{}", err.message);
        }
        let many: BTreeMap<String, f64> = (0..=MAX_BIASED).map(|i| (i.to_string(), 1.0)).collect();
        assert!(logit_bias(Some(many), 1 << 20)
            .unwrap_err()
            .message
            .contains("at most 1024"));
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
