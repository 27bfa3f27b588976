//! Chat messages to a prompt, through the model's own `chat_template`
//! (tokenizer_config.json), rendered by minijinja as transformers renders
//! it with Jinja: blocks trimmed and stripped, `{% break %}` and
//! `{% continue %}`, the Python string methods, `raise_exception`, its
//! `tojson`, `strftime_now`, and dicts in the order they were written.

use std::fmt::Write as _;

use chrono::format::{Item, StrftimeItems};
use chrono::NaiveDateTime;
use minijinja::{context, Environment, Error, ErrorKind};

use crate::api::{ApiError, Message};

/// What a model without a chat template gets: the messages' text, one per
/// line, so that a base model simply continues it.
const PLAIN: &str = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}";

/// The template comes with the model, not from the operator: a bound on the
/// instructions one rendering may run (a long conversation through a
/// typical template takes a few hundred thousand) keeps a template with a
/// runaway loop from holding a thread, and a bound on its output keeps it
/// from filling memory. The prompt's length is checked against the context
/// after rendering.
const FUEL: u64 = 20_000_000;
const MAX_OUTPUT: usize = 16 << 20;

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The model's template (none: the plain one), as given.
    source: Option<String>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` (the model's template, or the plain one when it
    /// has none): a template that does not compile is an error at start-up,
    /// not on the first request.
    pub fn new(source: Option<&str>, bos_token: String, eos_token: String) -> Result<Self, String> {
        Self::with_clock(source, bos_token, eos_token, || chrono::Local::now().naive_local())
    }

    /// [`ChatTemplate::new`], its `strftime_now` reading `clock`.
    fn with_clock(
        source: Option<&str>,
        bos_token: String,
        eos_token: String,
        clock: fn() -> NaiveDateTime,
    ) -> Result<Self, String> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(FUEL));
        // transformers' Jinja environment has trim_blocks and lstrip_blocks:
        // templates are written for them, their block tags on lines of
        // their own.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", crate::chat_json::tojson);
        // Templates call it to refuse conversations they cannot render.
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        // transformers' own: the local time, as Python's strftime writes it.
        env.add_function("strftime_now", move |format: String| strftime(clock(), &format));
        env.add_template_owned("chat", source.unwrap_or(PLAIN).to_string())
            .map_err(|e| format!("the chat template does not compile: {e}"))?;
        Ok(ChatTemplate {
            env,
            source: source.map(str::to_string),
            bos_token,
            eos_token,
        })
    }

    /// The template as given (none: the model has none), and the BOS and
    /// EOS texts it renders with: what another process needs to build it.
    pub fn parts(&self) -> (Option<&str>, &str, &str) {
        (self.source.as_deref(), &self.bos_token, &self.eos_token)
    }

    /// The prompt for `messages` (and the functions `tools` declares),
    /// ending where the assistant's answer begins.
    pub fn render(&self, messages: &[Message], tools: Option<&serde_json::Value>) -> Result<String, ApiError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let mut out = BoundedOutput(Vec::new());
        let rendered = template.render_captured_to(
            context! {
                messages => messages,
                // transformers passes both, as none when the request has
                // none: `tools is not none` must be false then.
                tools => tools.map(minijinja::Value::from_serialize),
                documents => (),
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            },
            &mut out,
        );
        let refused = |why: String| ApiError::invalid(why, Some("messages".into()));
        match rendered {
            Ok(_) => String::from_utf8(out.0).map_err(|_| refused("the chat template wrote invalid UTF-8".into())),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(refused(format!(
                "the chat template ran past its bound of {FUEL} steps on these messages"
            ))),
            Err(e) if e.kind() == ErrorKind::WriteFailure => Err(refused(format!(
                "the chat template wrote more than {} MiB for these messages",
                MAX_OUTPUT >> 20
            ))),
            Err(e) => Err(refused(format!("the chat template refused these messages: {e}"))),
        }
    }
}

/// A rendering's output, refusing to grow past [`MAX_OUTPUT`].
struct BoundedOutput(Vec<u8>);

impl std::io::Write for BoundedOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.0.len().saturating_add(bytes.len()) > MAX_OUTPUT {
            return Err(std::io::Error::other("the chat template's output is too long"));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `at` as Python's `strftime(format)` writes it, for the specifiers both
/// know; any other is an error naming the format, never a panic.
fn strftime(at: NaiveDateTime, format: &str) -> Result<String, Error> {
    let refused = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now cannot write '{format}'"),
        )
    };
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(refused());
    }
    let mut out = String::new();
    write!(out, "{}", at.format_with_items(items.into_iter())).map_err(|_| refused())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            ..Message::default()
        }
    }

    #[test]
    fn renders_a_hugging_face_template() {
        // llama-tiny's template, as its tokenizer_config.json has it.
        let source = "{% for m in messages %}<|begin|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}\
                      {% if add_generation_prompt %}<|begin|>assistant\n{% endif %}";
        let chat = ChatTemplate::new(Some(source), "<|begin|>".into(), "<|end|>".into()).unwrap();
        let prompt = chat
            .render(&[message("system", "Be brief."), message("user", "Hi")], None)
            .unwrap();
        assert_eq!(
            prompt,
            "<|begin|>system\nBe brief.<|end|>\n<|begin|>user\nHi<|end|>\n<|begin|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}\
                      {{ bos_token }}{{ messages[0]['content'].strip() }}";
        let chat = ChatTemplate::new(Some(source), "<s>".into(), "</s>".into()).unwrap();
        assert_eq!(chat.render(&[message("user", "  hi ")], None).unwrap(), "<s>hi");
        let err = chat.render(&[message("assistant", "x")], None).unwrap_err();
        assert!(
            err.message.starts_with("the chat template refused these messages: ") && err.message.contains("user first"),
            "{}",
            err.message
        );
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(
            (err.kind, err.param.as_deref()),
            ("invalid_request_error", Some("messages"))
        );
    }

    /// tests/fixtures/chat-templates: templates that use `tojson`, as
    /// transformers renders them.
    #[test]
    fn renders_as_transformers_does() {
        #[derive(serde::Deserialize)]
        struct Case {
            name: String,
            template: String,
            bos_token: String,
            eos_token: String,
            messages: Vec<Message>,
            rendered: String,
        }
        #[derive(serde::Deserialize)]
        struct Reference {
            cases: Vec<Case>,
        }
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/chat-templates/reference.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let reference: Reference = serde_json::from_str(&text).unwrap();
        assert_eq!(reference.cases.len(), 3);
        for case in reference.cases {
            let chat = ChatTemplate::new(Some(&case.template), case.bos_token, case.eos_token).unwrap();
            let prompt = chat
                .render(&case.messages, None)
                .unwrap_or_else(|e| panic!("{}: {}", case.name, e.message));
            assert_eq!(prompt, case.rendered, "{}", case.name);
        }
    }

    /// tests/fixtures/chat-templates/published.json: the published
    /// templates of seven model families, as transformers renders them
    /// (and refuses them: Gemma 2 and a system message), on the day its
    /// clock was held at.
    #[test]
    fn renders_published_templates_as_transformers_does() {
        #[derive(serde::Deserialize)]
        struct Case {
            template: String,
            conversation: String,
            messages: Vec<Message>,
            #[serde(default)]
            tools: Option<serde_json::Value>,
            rendered: Option<String>,
            error: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Reference {
            date: String,
            bos_token: String,
            eos_token: String,
            cases: Vec<Case>,
        }
        fn held_clock() -> NaiveDateTime {
            "2026-03-05T09:30:00".parse().unwrap()
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/chat-templates");
        let path = format!("{dir}/published.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let reference: Reference = serde_json::from_str(&text).unwrap();
        assert_eq!(held_clock(), reference.date.parse::<NaiveDateTime>().unwrap());
        assert_eq!(reference.cases.len(), 21);
        for case in reference.cases {
            let what = format!("{}, {}", case.template, case.conversation);
            let source = std::fs::read_to_string(format!("{dir}/published/{}.jinja", case.template)).unwrap();
            let (bos, eos) = (reference.bos_token.clone(), reference.eos_token.clone());
            let chat = ChatTemplate::with_clock(Some(&source), bos, eos, held_clock).unwrap();
            match (
                chat.render(&case.messages, case.tools.as_ref()),
                case.rendered,
                case.error,
            ) {
                (Ok(prompt), Some(rendered), None) => assert_eq!(prompt, rendered, "{what}"),
                (Err(refusal), None, Some(error)) => {
                    assert!(refusal.message.contains(&error), "{what}: {}", refusal.message)
                }
                (got, rendered, error) => panic!(
                    "{what}: {:?}, transformers {rendered:?} {error:?}",
                    got.map_err(|e| e.message)
                ),
            }
        }
    }

    #[test]
    fn strftime_now_writes_as_python_and_refuses_what_it_cannot() {
        let at: NaiveDateTime = "2026-03-05T09:30:00".parse().unwrap();
        assert_eq!(strftime(at, "%d %b %Y").unwrap(), "05 Mar 2026");
        assert_eq!(strftime(at, "%Y-%m-%d %H:%M").unwrap(), "2026-03-05 09:30");
        for format in ["%Q", "%z"] {
            let error = strftime(at, format).unwrap_err().to_string();
            assert!(error.contains(format), "{error}");
        }
    }

    #[test]
    fn tojson_refuses_arguments_python_would() {
        let chat = |source: &str| ChatTemplate::new(Some(source), String::new(), String::new()).unwrap();
        for (source, says) in [
            (
                "{{ 1 | tojson(true, indent=2, ensure_ascii=false) }}",
                "tojson got 'ensure_ascii' twice",
            ),
            (
                "{{ 1 | tojson(false, 2, none, false, 5) }}",
                "tojson takes at most 4 arguments",
            ),
            (
                "{{ 1 | tojson(indent=[1]) }}",
                "tojson's indent is [1]: not a number or a string",
            ),
            (
                "{{ 1 | tojson(separators=[','] ) }}",
                "tojson's separators are [\",\"]: not a pair of strings",
            ),
            ("{{ 1 | tojson(width=3) }}", "unknown keyword argument"),
        ] {
            let err = chat(source).render(&[message("user", "hi")], None).unwrap_err();
            assert!(err.message.contains(says), "{source}: {}", err.message);
        }
    }

    #[test]
    fn a_model_without_a_template_gets_the_plain_one() {
        let chat = ChatTemplate::new(None, String::new(), String::new()).unwrap();
        assert_eq!(
            chat.render(&[message("user", "The best way to")], None).unwrap(),
            "The best way to\n"
        );
    }

    #[test]
    fn a_runaway_template_is_stopped_by_its_bounds() {
        let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let chat = ChatTemplate::new(Some(endless), String::new(), String::new()).unwrap();
        let started = std::time::Instant::now();
        let err = chat.render(&[message("user", "hi")], None).unwrap_err();
        assert!(err.message.contains("ran past its bound"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert!(started.elapsed().as_secs() < 30, "took {:?}", started.elapsed());

        let flood = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
        let chat = ChatTemplate::new(Some(flood), String::new(), String::new()).unwrap();
        let err = chat.render(&[message("user", "hi")], None).unwrap_err();
        assert!(err.message.contains("wrote more than 16 MiB"), "{}", err.message);
    }

    #[test]
    fn a_broken_template_fails_at_start() {
        let err = ChatTemplate::new(Some("{% for %}"), String::new(), String::new())
            .err()
            .expect("a template that does not compile");
        assert!(err.starts_with("the chat template does not compile: "), "{err}");
        assert!(err.contains("syntax error"), "{err}");
    }
}
