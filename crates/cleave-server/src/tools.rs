//! Tool calls: a chat request's `tools`, `tool_choice` and
//! `parallel_tool_calls` checked; the grammar that makes `required` or a
//! named function a call whose arguments validate against its schema; and
//! the model's tool-call syntax read back into OpenAI's `tool_calls`,
//! whole or as a stream holds it back.
//!
//! Three syntaxes, picked from the chat template (or `--tool-format`): the
//! Hermes form Qwen's templates ask for, `<tool_call>\n{"name": ...,
//! "arguments": {...}}\n</tool_call>` (several in a row for parallel
//! calls); Mistral's `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
//! (Mistral 7B v0.3, Nemo; `[TOOL_CALLS]` is a special token in their
//! vocabularies, kept in the text of a request that declares tools); and
//! Llama 3's JSON, `{"name": ..., "parameters": {...}}` as the whole
//! answer. Text that does not parse as a call of a declared function is the
//! answer's content, as vLLM's parsers leave it.

use cleave_grammar::Grammar;
use serde_json::{json, Map, Value};

use crate::api::ApiError;
use crate::harmony;

/// Most tools a request may declare (OpenAI's limit).
const MAX_TOOLS: usize = 128;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";

/// What Mistral's ids are spelled in: its templates take nine of these.
const ALPHANUMERIC: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// How a model writes a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen, Hermes).
    Hermes,
    /// `[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]` (Mistral 7B
    /// v0.3, Nemo).
    Mistral,
    /// `{"name": ..., "parameters": ...}` as the whole answer (Llama 3.x).
    Llama3Json,
    /// gpt-oss's harmony: a message to the function, `<|channel|>commentary
    /// to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.
    Harmony,
}

impl ToolFormat {
    /// The syntax `template` asks its model to call tools in, where it
    /// asks for one cleave reads.
    pub fn of_template(template: &str) -> Option<ToolFormat> {
        if harmony::is_harmony(template) {
            Some(ToolFormat::Harmony)
        } else if template.contains(HERMES_OPEN) {
            Some(ToolFormat::Hermes)
        } else if template.contains(MISTRAL_OPEN) && !template.contains("[ARGS]") {
            // Later Mistral templates write `[TOOL_CALLS]name[ARGS]{...}`,
            // another syntax.
            Some(ToolFormat::Mistral)
        } else if template.contains(r#""parameters": dictionary"#) {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }

    /// The key holding a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::Harmony => "arguments",
            ToolFormat::Llama3Json => "parameters",
        }
    }

    /// What opens a call where calls may follow text.
    fn opening(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some(HERMES_OPEN),
            ToolFormat::Mistral => Some(MISTRAL_OPEN),
            ToolFormat::Harmony => Some(harmony::CHANNEL),
            ToolFormat::Llama3Json => None,
        }
    }

    /// Whether the answer's text keeps the special tokens it holds: where
    /// they mark the calls.
    pub fn keeps_special_tokens(self) -> bool {
        matches!(self, ToolFormat::Mistral | ToolFormat::Harmony)
    }

    /// A fresh id for an answer's `index`th call: OpenAI's `call_...`, or
    /// the nine letters and digits Mistral's templates require of the ids
    /// sent back to them.
    pub fn call_id(self, seed: u64, index: usize) -> String {
        match self {
            ToolFormat::Mistral => {
                // An odd multiplier is a bijection: distinct indices, distinct ids.
                let mut n = seed.wrapping_add(index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (0..9)
                    .map(|_| {
                        let c = ALPHANUMERIC[(n % 62) as usize];
                        n /= 62;
                        c as char
                    })
                    .collect()
            }
            ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Harmony => format!("call_{seed:x}{index}"),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A chat request's tools, checked.
#[derive(Debug)]
pub struct ToolRequest {
    /// The `tools` list as sent: what the chat template renders.
    pub tools: Value,
    /// Each function's name and parameters' schema.
    functions: Vec<(String, Value)>,
    choice: Choice,
    parallel: bool,
    format: ToolFormat,
}

/// One call the model made.
#[derive(Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text, as OpenAI sends them.
    pub arguments: String,
}

/// An answer read for tool calls: the text around them, and the calls.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// The request's tools, or `None` where it declares none or
/// `tool_choice` is `none`; `format` is the model's syntax, if it has one.
pub fn check(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
    format: Option<ToolFormat>,
) -> Result<Option<ToolRequest>, ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let list = match tools {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(list)) => list.as_slice(),
        Some(_) => return Err(invalid("'tools' is a list of functions".into(), "tools")),
    };
    let choice = match tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) if s == "auto" => Choice::Auto,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "required" => Choice::Required,
        Some(named @ Value::Object(_)) => match named.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if named["type"] == "function" => Choice::Named(name.to_string()),
            _ => {
                return Err(invalid(
                    "tool_choice names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}".into(),
                    "tool_choice",
                ))
            }
        },
        Some(other) => {
            return Err(invalid(
                format!("tool_choice {other} is not one of none, auto, required or a named function"),
                "tool_choice",
            ))
        }
    };
    if list.is_empty() {
        return match choice {
            Choice::Auto => Ok(None),
            _ => Err(invalid(
                "tool_choice asks for a call, but 'tools' declares none".into(),
                "tool_choice",
            )),
        };
    }
    if list.len() > MAX_TOOLS {
        return Err(invalid(format!("{} tools: at most {MAX_TOOLS}", list.len()), "tools"));
    }
    let mut functions: Vec<(String, Value)> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        if tool["type"] != "function" {
            return Err(invalid(format!("tools[{i}] is not of type 'function'"), "tools"));
        }
        let name = tool
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(invalid(
                format!("tools[{i}] needs a function name of 1 to 64 letters, digits, '_' or '-'"),
                "tools",
            ));
        }
        if functions.iter().any(|(n, _)| n == name) {
            return Err(invalid(
                format!("tools[{i}]: function '{name}' is declared twice"),
                "tools",
            ));
        }
        let parameters = match tool.pointer("/function/parameters") {
            // A function without parameters takes no arguments.
            None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => {
                return Err(invalid(
                    format!("tools[{i}]: parameters is a JSON schema object"),
                    "tools",
                ))
            }
        };
        functions.push((name.to_string(), parameters));
    }
    if let Choice::Named(name) = &choice {
        if !functions.iter().any(|(n, _)| n == name) {
            return Err(invalid(
                format!("tool_choice names '{name}', which 'tools' does not declare"),
                "tool_choice",
            ));
        }
    }
    let format = format.ok_or_else(|| {
        invalid(
            "the model's chat template writes tool calls in no syntax cleave reads (Hermes' <tool_call>, \
             Mistral's [TOOL_CALLS] or Llama 3's JSON): start cleave serve with --tool-format"
                .into(),
            "tools",
        )
    })?;
    Ok(Some(ToolRequest {
        tools: Value::Array(list.to_vec()),
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
        format,
    }))
}

impl ToolRequest {
    /// The grammar that holds the answer to a call, where `tool_choice`
    /// asks for one: of any declared function for `required` (several in a
    /// row where calls may be parallel), one of the named one otherwise,
    /// its arguments valid against the function's schema.
    ///
    /// `special_id` gives the id of a special token by its text: Mistral's
    /// `[TOOL_CALLS]` is one token where the vocabulary has it as one.
    pub fn grammar(&self, special_id: impl Fn(&str) -> Option<u32>) -> Option<Grammar> {
        // A special token by its id where the vocabulary has it as one.
        let marker = |text: &str| match special_id(text) {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(text),
        };
        let (callable, several): (Vec<&(String, Value)>, bool) = match &self.choice {
            Choice::Auto => return None,
            Choice::Required => (self.functions.iter().collect(), self.parallel),
            Choice::Named(name) => (self.functions.iter().filter(|(n, _)| n == name).collect(), false),
        };
        let key = self.format.arguments_key();
        let calls: Vec<Value> = callable
            .iter()
            .map(|(name, parameters)| {
                json!({"type": "object", "properties": {"name": {"const": name}, key: parameters},
                       "required": ["name", key], "additionalProperties": false})
            })
            .collect();
        let schema = json!({"anyOf": calls});
        let lark = match self.format {
            ToolFormat::Llama3Json => return Some(Grammar::JsonSchema(schema)),
            ToolFormat::Hermes => {
                let schema = inline(schema);
                let calls = if several { "call (\"\\n\" call)*" } else { "call" };
                format!(
                    "start: {calls}\ncall: {} %json {schema} {}\n",
                    lark_string(&format!("{HERMES_OPEN}\n")),
                    lark_string(&format!("\n{HERMES_CLOSE}")),
                )
            }
            ToolFormat::Mistral => {
                let schema = inline(schema);
                let open = marker(MISTRAL_OPEN);
                let calls = if several { "call (\", \" call)*" } else { "call" };
                format!("start: {open} \"[\" {calls} \"]\"\ncall: %json {schema}\n")
            }
            // One call a turn: the model's turn ends at `<|call|>`.
            ToolFormat::Harmony => {
                let rules: Vec<String> = callable
                    .iter()
                    .enumerate()
                    .map(|(i, (name, parameters))| {
                        let header = lark_string(&format!("commentary to=functions.{name} "));
                        let (channel, constrain) = (marker(harmony::CHANNEL), marker(harmony::CONSTRAIN));
                        let (message, call) = (marker(harmony::MESSAGE), marker(harmony::CALL));
                        let arguments = inline(parameters.clone());
                        format!("call{i}: {channel} {header} {constrain} \"json\" {message} %json {arguments} {call}")
                    })
                    .collect();
                let calls: Vec<String> = (0..rules.len()).map(|i| format!("call{i}")).collect();
                format!("start: {}\n{}\n", calls.join(" | "), rules.join("\n"))
            }
        };
        Some(Grammar::Lark(lark))
    }

    /// `text` read for calls of the declared functions; where it holds
    /// none (or anything malformed), all of it is the content.
    pub fn parse(&self, text: &str) -> Parsed {
        let calls = match self.format {
            ToolFormat::Hermes => self.hermes_calls(text),
            ToolFormat::Mistral => self.mistral_calls(text),
            ToolFormat::Llama3Json => self.llama3_call(text).map(|call| (String::new(), vec![call])),
            ToolFormat::Harmony => self.harmony_calls(text),
        };
        match calls {
            Some((content, calls)) if !calls.is_empty() && (self.parallel || calls.len() == 1) => Parsed {
                content: (!content.is_empty()).then_some(content),
                calls,
            },
            _ => Parsed {
                content: Some(text.to_string()),
                calls: Vec::new(),
            },
        }
    }

    fn hermes_calls(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        let start = text.find(HERMES_OPEN)?;
        let mut rest = &text[start..];
        let mut calls = Vec::new();
        while let Some(after) = rest.strip_prefix(HERMES_OPEN) {
            let (body, next) = after.split_once(HERMES_CLOSE).unwrap_or((after, ""));
            calls.push(self.call(serde_json::from_str(body.trim()).ok()?)?);
            rest = next.trim_start();
        }
        rest.is_empty().then(|| (text[..start].trim().to_string(), calls))
    }

    fn mistral_calls(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        let start = text.find(MISTRAL_OPEN)?;
        let list: Vec<Value> = serde_json::from_str(text[start + MISTRAL_OPEN.len()..].trim()).ok()?;
        let calls = list.into_iter().map(|call| self.call(call)).collect::<Option<_>>()?;
        Some((text[..start].trim().to_string(), calls))
    }

    /// The answer's messages to functions, their arguments a JSON object;
    /// the final channel is the content.
    fn harmony_calls(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        let channels = harmony::split(text);
        let calls = channels
            .calls
            .into_iter()
            .map(|(name, arguments)| {
                let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
                self.call(json!({"name": name, "arguments": arguments}))
            })
            .collect::<Option<_>>()?;
        Some((channels.content, calls))
    }

    fn llama3_call(&self, text: &str) -> Option<ToolCall> {
        let text = text.trim();
        let text = text.strip_prefix("<|python_tag|>").unwrap_or(text);
        self.call(serde_json::from_str(text).ok()?)
    }

    /// A call from its JSON object: a declared function's name, and its
    /// arguments (an object, or a text holding one).
    fn call(&self, value: Value) -> Option<ToolCall> {
        let mut object: Map<String, Value> = match value {
            Value::Object(o) => o,
            _ => return None,
        };
        let name = object.remove("name")?.as_str()?.to_string();
        self.functions.iter().find(|(n, _)| *n == name)?;
        let arguments = match object
            .remove(self.format.arguments_key())
            .or_else(|| object.remove("arguments"))?
        {
            Value::String(s) => serde_json::from_str::<Map<String, Value>>(&s).ok().map(|_| s)?,
            arguments @ Value::Object(_) => arguments.to_string(),
            _ => return None,
        };
        Some(ToolCall { name, arguments })
    }

    /// OpenAI's `tool_calls` entries for `calls` (`index` only in a
    /// stream's delta), with fresh ids ([`ToolFormat::call_id`]).
    pub fn calls_json(&self, calls: &[ToolCall], streaming: bool, id_seed: u64) -> Value {
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut entry = json!({"id": self.format.call_id(id_seed, i), "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}});
                if streaming {
                    entry["index"] = json!(i);
                }
                entry
            })
            .collect()
    }

    /// How the model writes its calls.
    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// A stream of this request's answer, holding back what may be a call.
    pub fn stream(&self) -> ToolStream<'_> {
        ToolStream {
            request: self,
            text: String::new(),
            sent: 0,
            holding: false,
        }
    }
}

/// An answer streamed piece by piece: text is handed out until it may be
/// the start of a call, then held until the end, when it is read.
pub struct ToolStream<'a> {
    request: &'a ToolRequest,
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
    holding: bool,
}

impl ToolStream<'_> {
    /// Takes the next piece; the text that can be handed out now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.holding {
            return String::new();
        }
        let unsent = &self.text[self.sent..];
        let end = match self.request.format.opening() {
            Some(open) => match unsent.find(open) {
                Some(at) => {
                    self.holding = true;
                    at
                }
                // A tail that may begin the opening tag waits for the next piece.
                None => {
                    let held = (1..open.len())
                        .filter(|&n| unsent.ends_with(&open[..n]))
                        .max()
                        .unwrap_or(0);
                    unsent.len() - held
                }
            },
            // Llama 3 calls are the whole answer: decided by its first
            // character that is not a space.
            None => match self.text.trim_start().chars().next() {
                None => 0,
                Some('{' | '<') if self.sent == 0 => {
                    self.holding = true;
                    0
                }
                Some(_) => unsent.len(),
            },
        };
        let out = unsent[..end].to_string();
        self.sent += end;
        out
    }

    /// At the end of the answer: the text not yet handed out, and the
    /// calls, where the held text is calls.
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        let parsed = self.request.parse(&self.text);
        match parsed.calls.is_empty() {
            true => (self.text[self.sent..].to_string(), Vec::new()),
            false => (String::new(), parsed.calls),
        }
    }
}

/// `schema` for a Lark grammar's `%json`: inline schemas take llguidance's
/// layout options as the top-level ones do (see cleave_grammar's compact
/// layout).
fn inline(mut schema: Value) -> Value {
    schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    schema
}

fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather(format: ToolFormat, choice: Value) -> ToolRequest {
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}]);
        check(Some(&tools), Some(&choice), None, Some(format)).unwrap().unwrap()
    }

    #[test]
    fn hermes_calls_are_read_and_other_text_is_content() {
        let tools = weather(ToolFormat::Hermes, json!("auto"));
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let parsed = tools.parse(text);
        assert_eq!(parsed.content.as_deref(), Some("Let me look."));
        assert_eq!(
            parsed.calls,
            [
                ToolCall {
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Bern"}"#.into()
                },
                ToolCall {
                    name: "now".into(),
                    arguments: "{}".into()
                }
            ]
        );
        for plain in [
            "Sunny.",
            "<tool_call>{\"name\": \"unknown\", \"arguments\": {}}</tool_call>",
            "<tool_call>{not json</tool_call>",
        ] {
            assert_eq!(tools.parse(plain).content.as_deref(), Some(plain));
            assert!(tools.parse(plain).calls.is_empty());
        }
    }

    #[test]
    fn llama3_calls_are_the_whole_answer() {
        let tools = weather(ToolFormat::Llama3Json, json!("auto"));
        let parsed = tools.parse(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Bern\"}}");
        assert_eq!(parsed.content, None);
        assert_eq!(parsed.calls[0].arguments, r#"{"city":"Bern"}"#);
        assert!(tools.parse("It is {\"name\": \"now\"}").calls.is_empty());
    }

    #[test]
    fn a_stream_hands_out_text_and_holds_back_calls() {
        let tools = weather(ToolFormat::Hermes, json!("auto"));
        let mut stream = tools.stream();
        let pieces = [
            "Let me ",
            "look. <tool",
            "_call>\n{\"name\": \"now\", ",
            "\"arguments\": {}}\n</tool_call>",
        ];
        let sent: Vec<String> = pieces.iter().map(|p| stream.push(p)).collect();
        assert_eq!(sent, ["Let me ", "look. ", "", ""]);
        let (rest, calls) = stream.finish();
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        // A held tail that turns out not to be a call is handed out in the end.
        let mut stream = tools.stream();
        assert_eq!(stream.push("a <tool"), "a ");
        assert_eq!(stream.finish(), ("<tool".to_string(), Vec::new()));
    }

    #[test]
    fn required_and_named_choices_are_grammars_of_calls() {
        assert_eq!(weather(ToolFormat::Hermes, json!("auto")).grammar(|_| None), None);
        let Some(Grammar::Lark(lark)) = weather(ToolFormat::Hermes, json!("required")).grammar(|_| None) else {
            panic!("a Lark grammar")
        };
        assert!(
            lark.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" %json {"),
            "{lark}"
        );
        assert!(
            lark.contains(r#"{"const":"get_weather"}"#) && lark.contains(r#"{"const":"now"}"#),
            "{lark}"
        );
        let named = json!({"type": "function", "function": {"name": "now"}});
        let Some(Grammar::JsonSchema(schema)) = weather(ToolFormat::Llama3Json, named).grammar(|_| None) else {
            panic!("a JSON schema")
        };
        assert_eq!(schema["anyOf"].as_array().unwrap().len(), 1);
        assert_eq!(schema["anyOf"][0]["properties"]["name"]["const"], "now");
    }

    /// Mistral's calls follow its marker as a JSON list; the grammar opens
    /// with the marker's special token where the vocabulary has one, its
    /// text otherwise; ids are the nine letters and digits its template
    /// takes back.
    #[test]
    fn mistral_calls_are_a_list_after_the_marker() {
        let tools = weather(ToolFormat::Mistral, json!("auto"));
        let text = "Checking. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, {\"name\": \"now\", \"arguments\": {}}]";
        let parsed = tools.parse(text);
        assert_eq!(parsed.content.as_deref(), Some("Checking."));
        let names: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "now"]);
        for plain in [
            "[TOOL_CALLS] not a list",
            "[TOOL_CALLS][{\"name\": \"unknown\", \"arguments\": {}}]",
        ] {
            assert!(tools.parse(plain).calls.is_empty(), "{plain}");
        }
        let mut stream = tools.stream();
        assert_eq!(stream.push("Checking. [TOOL"), "Checking. ");
        assert_eq!(stream.push("_CALLS][{\"name\": \"now\", \"arguments\": {}}]"), "");
        assert_eq!(stream.finish().1.len(), 1);
        let required = weather(ToolFormat::Mistral, json!("required"));
        let Some(Grammar::Lark(special)) = required.grammar(|text| (text == "[TOOL_CALLS]").then_some(5)) else {
            panic!("a Lark grammar")
        };
        assert!(
            special.starts_with("start: <[5]> \"[\" call (\", \" call)* \"]\"\ncall: %json {"),
            "{special}"
        );
        let Some(Grammar::Lark(spelled)) = required.grammar(|_| None) else {
            panic!("a Lark grammar")
        };
        assert!(spelled.starts_with("start: \"[TOOL_CALLS]\" \"[\""), "{spelled}");
        let ids: Vec<String> = (0..3).map(|i| ToolFormat::Mistral.call_id(7, i)).collect();
        assert!(
            ids.iter()
                .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())),
            "{ids:?}"
        );
        assert!(ids[0] != ids[1] && ids[1] != ids[2], "{ids:?}");
        assert_eq!(ToolFormat::Hermes.call_id(7, 1), "call_71");
    }

    #[test]
    fn harmony_calls_are_messages_to_functions() {
        let request = weather(ToolFormat::Harmony, json!("auto"));
        let text = "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Bern\"}";
        let parsed = request.parse(text);
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: r#"{"city":"Bern"}"#.into(),
        };
        assert_eq!((parsed.content, parsed.calls), (None, vec![call]));
        // A call of an undeclared function leaves the text as it is.
        let unknown = text.replace("get_weather", "get_news");
        assert!(request.parse(&unknown).calls.is_empty());

        let named = weather(
            ToolFormat::Harmony,
            json!({"type": "function", "function": {"name": "get_weather"}}),
        );
        let Some(Grammar::Lark(lark)) = named.grammar(|t| (t == "<|call|>").then_some(7)) else {
            panic!("a named call is a grammar");
        };
        assert!(
            lark.contains("to=functions.get_weather") && lark.contains("<[7]>"),
            "{lark}"
        );
        assert!(!lark.contains("functions.now"), "{lark}");
    }

    #[test]
    fn a_template_names_its_syntax() {
        let published = |name: &str| {
            let path = format!(
                "{}/../../tests/fixtures/chat-templates/published/{name}.jinja",
                env!("CARGO_MANIFEST_DIR")
            );
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        for (name, format) in [
            ("Qwen2.5-7B-Instruct", Some(ToolFormat::Hermes)),
            ("Qwen3-0.6B", Some(ToolFormat::Hermes)),
            ("Mistral-Nemo-Instruct-2407", Some(ToolFormat::Mistral)),
            ("Llama-3.2-3B-Instruct", Some(ToolFormat::Llama3Json)),
            ("gpt-oss-120b", Some(ToolFormat::Harmony)),
            ("gemma-3-4b-it", None),
        ] {
            assert_eq!(ToolFormat::of_template(&published(name)), format, "{name}");
        }
        assert_eq!(ToolFormat::of_template("[TOOL_CALLS]{{ name }}[ARGS]{{ args }}"), None);
    }

    #[test]
    fn bad_tools_are_named() {
        let error = |tools: Value, choice: Value| {
            let e = check(Some(&tools), Some(&choice), None, Some(ToolFormat::Hermes)).unwrap_err();
            (e.param.unwrap(), e.message)
        };
        let (param, message) = error(
            json!([{"type": "function", "function": {"description": "x"}}]),
            json!("auto"),
        );
        assert_eq!(param, "tools");
        assert!(message.contains("tools[0] needs a function name"), "{message}");
        let f = json!([{"type": "function", "function": {"name": "f"}}]);
        let (param, _) = error(f.clone(), json!({"type": "function", "function": {"name": "g"}}));
        assert_eq!(param, "tool_choice");
        let (param, _) = error(json!([]), json!("required"));
        assert_eq!(param, "tool_choice");
        let e = check(Some(&f), None, None, None).unwrap_err();
        assert!(e.message.contains("--tool-format"), "{}", e.message);
        assert!(check(Some(&f), Some(&json!("none")), None, None).unwrap().is_none());
    }
}
