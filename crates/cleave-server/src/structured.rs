//! Structured outputs: the grammar a request holds its answer to, under
//! the names clients send it by. OpenAI's `response_format`
//! (`json_object`, `json_schema`), llama.cpp's `grammar` (GBNF, or Lark
//! after `%llguidance`) and `json_schema`, and vLLM's
//! `structured_outputs` (`json`, `regex`, `grammar`, `choice`). At most
//! one per request.

use cleave_grammar::{Constrainer, Constraint, Grammar, GrammarError};
use serde::Deserialize;
use serde_json::Value;

use crate::api::ApiError;

/// The fields of a request that ask for structured output.
#[derive(Debug, Default, Deserialize)]
pub struct StructuredFields {
    pub response_format: Option<Value>,
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
    pub structured_outputs: Option<Value>,
}

/// Most alternatives `structured_outputs.choice` may list.
const MAX_CHOICES: usize = 1024;

impl StructuredFields {
    /// The grammar these fields ask for, and the field that asked; `None`
    /// for free text.
    pub fn grammar(&self) -> Result<Option<(Grammar, &'static str)>, ApiError> {
        let mut asked = Vec::new();
        if let Some(format) = &self.response_format {
            if let Some(grammar) = response_format(format)? {
                asked.push((grammar, "response_format"));
            }
        }
        if let Some(text) = &self.grammar {
            asked.push((Grammar::llama_cpp(text), "grammar"));
        }
        if let Some(schema) = &self.json_schema {
            asked.push((Grammar::JsonSchema(schema.clone()), "json_schema"));
        }
        if let Some(outputs) = &self.structured_outputs {
            asked.push((structured_outputs(outputs)?, "structured_outputs"));
        }
        match asked.len() {
            0 | 1 => Ok(asked.pop()),
            _ => Err(ApiError::invalid(
                format!("{} and {} both constrain the answer: send one", asked[0].1, asked[1].1),
                Some(asked[1].1.into()),
            )),
        }
    }
}

/// `response_format`: `text` (nothing), `json_object`, or `json_schema`
/// with its `json_schema.schema`.
fn response_format(format: &Value) -> Result<Option<Grammar>, ApiError> {
    let invalid = |message: String| ApiError::invalid(message, Some("response_format".into()));
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::json_object())),
        Some("json_schema") => match &format["json_schema"]["schema"] {
            // A json_schema without a schema asks for any JSON value.
            Value::Null => Ok(Some(Grammar::JsonSchema(Value::Bool(true)))),
            schema => Ok(Some(Grammar::JsonSchema(schema.clone()))),
        },
        Some(other) => Err(invalid(format!(
            "response_format type '{other}' is not one of text, json_object, json_schema"
        ))),
        None => Err(invalid("response_format needs a 'type'".into())),
    }
}

/// vLLM's `structured_outputs`: one of `json` (a schema), `regex`,
/// `grammar` or `choice` (a list of strings, one of which is the answer).
fn structured_outputs(outputs: &Value) -> Result<Grammar, ApiError> {
    let invalid = |message: String| ApiError::invalid(message, Some("structured_outputs".into()));
    let object = outputs
        .as_object()
        .ok_or_else(|| invalid("structured_outputs is an object".into()))?;
    let set: Vec<(&String, &Value)> = object.iter().filter(|(_, v)| !v.is_null()).collect();
    let [(key, value)] = set.as_slice() else {
        return Err(invalid(
            "structured_outputs takes exactly one of json, regex, grammar, choice".into(),
        ));
    };
    let text = |what: &str| {
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| invalid(format!("structured_outputs.{what} is a string")))
    };
    match key.as_str() {
        "json" => match value {
            Value::String(s) => serde_json::from_str(s)
                .map(Grammar::JsonSchema)
                .map_err(|e| invalid(format!("structured_outputs.json is not JSON: {e}"))),
            schema => Ok(Grammar::JsonSchema((*schema).clone())),
        },
        "regex" => Ok(Grammar::Regex(text("regex")?)),
        "grammar" => Ok(Grammar::llama_cpp(&text("grammar")?)),
        "choice" => {
            let choices: Vec<&str> = value
                .as_array()
                .filter(|c| !c.is_empty() && c.len() <= MAX_CHOICES)
                .and_then(|c| c.iter().map(Value::as_str).collect())
                .ok_or_else(|| {
                    invalid(format!(
                        "structured_outputs.choice is a list of 1 to {MAX_CHOICES} strings"
                    ))
                })?;
            let alternatives: Vec<String> = choices
                .iter()
                .map(|c| serde_json::to_string(c).unwrap_or_default())
                .collect();
            Ok(Grammar::Lark(format!("start: {}", alternatives.join(" | "))))
        }
        other => Err(invalid(format!(
            "structured_outputs.{other} is not one of json, regex, grammar, choice"
        ))),
    }
}

/// `grammar` compiled for one request, its errors a 400 naming `field`.
pub fn compile(constrainer: &Constrainer, grammar: &Grammar, field: &'static str) -> Result<Constraint, ApiError> {
    constrainer.compile(grammar).map_err(|e| {
        let message = match e {
            GrammarError::Invalid(reason) => format!("{field}: the grammar cannot be compiled: {reason}"),
            other => format!("{field}: {other}"),
        };
        ApiError::invalid(message, Some(field.into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> StructuredFields {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn each_name_gives_its_grammar() {
        let grammar = |body| fields(body).grammar().unwrap();
        assert_eq!(grammar(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(
            grammar(json!({"response_format": {"type": "json_object"}})),
            Some((Grammar::json_object(), "response_format"))
        );
        let schema = json!({"type": "integer"});
        assert_eq!(
            grammar(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}})
            ),
            Some((Grammar::JsonSchema(schema.clone()), "response_format"))
        );
        assert_eq!(
            grammar(json!({"structured_outputs": {"json": schema.to_string()}})),
            Some((Grammar::JsonSchema(schema.clone()), "structured_outputs"))
        );
        assert_eq!(
            grammar(json!({"grammar": "root ::= \"a\""})),
            Some((Grammar::Gbnf("root ::= \"a\"".into()), "grammar"))
        );
        assert_eq!(
            grammar(json!({"structured_outputs": {"choice": ["yes", "n\"o"]}})),
            Some((Grammar::Lark(r#"start: "yes" | "n\"o""#.into()), "structured_outputs"))
        );
    }

    #[test]
    fn what_cannot_be_read_is_named() {
        let error = |body| fields(body).grammar().unwrap_err();
        let e = error(json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}));
        assert!(e.message.contains("response_format and grammar both"), "{}", e.message);
        let e = error(json!({"response_format": {"type": "xml"}}));
        assert_eq!(e.param.as_deref(), Some("response_format"));
        let e = error(json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}));
        assert!(e.message.contains("exactly one"), "{}", e.message);
        let e = error(json!({"structured_outputs": {"choice": []}}));
        assert!(e.message.contains("list of 1 to"), "{}", e.message);
    }
}
