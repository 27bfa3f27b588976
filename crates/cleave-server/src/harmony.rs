//! gpt-oss's harmony format. Its chat template ends a prompt at
//! `<|start|>assistant`, and the model answers with messages, each a
//! header naming its channel (`<|channel|>analysis`, `<|channel|>final`)
//! then `<|message|>` and the message's text, ended by `<|end|>` (and the
//! next one begun by `<|start|>assistant`) or by the answer's end
//! (`<|return|>` and `<|call|>` are end-of-sequence tokens). The `final`
//! channel is the answer, the chat's `content`; `analysis` is the model's
//! reasoning, handed out as `reasoning_content`, as vLLM and llama.cpp
//! do. A message to a function (`to=functions.NAME` in its header) is a
//! call, its text the arguments; other channels are left out.

/// The markers of harmony's messages, as the template writes them.
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
/// What marks a message's arguments as JSON, and ends a call.
pub const CONSTRAIN: &str = "<|constrain|>";
pub const CALL: &str = "<|call|>";
/// Where a message to a function names it: `to=functions.NAME`.
const TO_FUNCTION: &str = "to=functions.";
/// What else ends a message's text: a model that starts the next message
/// without ending its last, or an end-of-sequence token left in the text.
const ENDINGS: [&str; 5] = [END, "<|start|>", CHANNEL, "<|return|>", CALL];

/// Whether a chat template writes the harmony format.
pub fn is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// The parts of an answer that the API hands out.
#[derive(Debug, Default, PartialEq)]
pub struct Channels {
    /// The `analysis` channel's text.
    pub reasoning: String,
    /// The `final` channel's text.
    pub content: String,
    /// Each whole message to a function: its name and its text.
    pub calls: Vec<(String, String)>,
}

impl Channels {
    fn append(&mut self, more: Channels) {
        self.reasoning.push_str(&more.reasoning);
        self.content.push_str(&more.content);
        self.calls.extend(more.calls);
    }

    /// Whether it holds reasoning or content (a stream's delta).
    pub fn has_text(&self) -> bool {
        !(self.reasoning.is_empty() && self.content.is_empty())
    }
}

/// Where the message being read goes.
#[derive(Clone, Debug, PartialEq)]
enum Channel {
    Analysis,
    Final,
    /// A call of the function named, its text read so far.
    Call(String, String),
    Other,
}

/// An answer (decoded with its special tokens) read piece by piece.
#[derive(Debug, Default)]
pub struct HarmonyStream {
    text: String,
    /// Bytes of `text` read.
    read: usize,
    /// The channel of the message whose text is being read; `None` while
    /// reading a header.
    channel: Option<Channel>,
}

impl HarmonyStream {
    /// Takes the next piece of the answer; what of it can be handed out
    /// now (a tail that may begin a marker waits for the next piece).
    pub fn push(&mut self, piece: &str) -> Channels {
        self.text.push_str(piece);
        self.read_on(false)
    }

    /// At the end of the answer: what was not handed out. An answer
    /// without a single header (a model that ignored the format) is all
    /// content.
    pub fn finish(mut self) -> Channels {
        if self.channel.is_none() && self.read == 0 && !self.text.contains(MESSAGE) {
            return Channels {
                content: self.text,
                ..Channels::default()
            };
        }
        self.read_on(true)
    }

    fn read_on(&mut self, at_end: bool) -> Channels {
        let mut out = Channels::default();
        loop {
            let unread = &self.text[self.read..];
            match &mut self.channel {
                None => {
                    let Some(at) = unread.find(MESSAGE) else {
                        return out;
                    };
                    self.channel = Some(channel_of(&unread[..at]));
                    self.read += at + MESSAGE.len();
                }
                Some(channel) => {
                    let ending = ENDINGS.iter().filter_map(|e| unread.find(e).map(|at| (at, *e))).min();
                    let (text, read) = match ending {
                        Some((at, e)) => (&unread[..at], at + if e == END { e.len() } else { 0 }),
                        None if at_end => (unread, unread.len()),
                        None => {
                            let held = held_back(unread);
                            (&unread[..unread.len() - held], unread.len() - held)
                        }
                    };
                    match channel {
                        Channel::Analysis => out.reasoning.push_str(text),
                        Channel::Final => out.content.push_str(text),
                        Channel::Call(_, arguments) => arguments.push_str(text),
                        Channel::Other => {}
                    }
                    self.read += read;
                    if ending.is_none() && !at_end {
                        return out;
                    }
                    if let Some(Channel::Call(name, arguments)) = self.channel.take() {
                        out.calls.push((name, arguments));
                    }
                    if ending.is_none() {
                        return out;
                    }
                }
            }
        }
    }
}

/// The whole answer's channels.
pub fn split(text: &str) -> Channels {
    let mut stream = HarmonyStream::default();
    let mut channels = stream.push(text);
    channels.append(stream.finish());
    channels
}

/// Where a message goes by its header: a call where it names a function
/// (`to=functions.NAME`, before or after its channel), else its channel,
/// `analysis`, `final` or another.
fn channel_of(header: &str) -> Channel {
    let word = |after: &str| {
        after
            .split(|c: char| c.is_whitespace() || c == '<')
            .next()
            .unwrap_or("")
            .to_string()
    };
    if let Some(to) = header.find(TO_FUNCTION) {
        return Channel::Call(word(&header[to + TO_FUNCTION.len()..]), String::new());
    }
    let name = header.rsplit(CHANNEL).next().filter(|_| header.contains(CHANNEL));
    match name.map(word).as_deref() {
        Some("analysis") => Channel::Analysis,
        Some("final") => Channel::Final,
        _ => Channel::Other,
    }
}

/// Bytes at the end of `text` that may begin a marker.
fn held_back(text: &str) -> usize {
    ENDINGS
        .iter()
        .flat_map(|e| (1..e.len()).filter(|&n| text.ends_with(&e[..n])))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello «there»!";

    #[test]
    fn the_final_channel_is_the_content_and_analysis_the_reasoning() {
        let channels = split(ANSWER);
        assert_eq!(channels.reasoning, "The user greets.");
        assert_eq!(channels.content, "Hello «there»!");
        // A call's commentary is neither; an answer without headers is content.
        let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Bern\"}";
        assert_eq!(
            (split(call).reasoning, split(call).content),
            (String::new(), String::new())
        );
        assert_eq!(split("plain words").content, "plain words");
    }

    #[test]
    fn a_stream_hands_out_what_each_piece_completes() {
        // Every way of cutting the answer in two gives the same channels,
        // and no marker's text is ever handed out.
        for cut in (0..=ANSWER.len()).filter(|&i| ANSWER.is_char_boundary(i)) {
            let mut stream = HarmonyStream::default();
            let mut got = stream.push(&ANSWER[..cut]);
            got.append(stream.push(&ANSWER[cut..]));
            got.append(stream.finish());
            assert_eq!(got, split(ANSWER), "cut at {cut}");
            assert!(
                !got.content.contains("<|") && !got.reasoning.contains("<|"),
                "cut at {cut}"
            );
        }
        // The reasoning is out before the answer begins.
        let mut stream = HarmonyStream::default();
        let first = stream.push("<|channel|>analysis<|message|>Thinking");
        assert_eq!(first.reasoning, "Thinking");
    }

    #[test]
    fn calls_are_the_messages_to_functions() {
        let answer = "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary \
                      to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Bern\"}";
        assert_eq!(
            split(answer).calls,
            [("get_weather".to_string(), "{\"city\": \"Bern\"}".to_string())]
        );
        // The recipient may come before the channel, as the template
        // writes past calls.
        let before = " to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(split(before).calls, [("f".to_string(), "{}".to_string())]);
        assert!(split(ANSWER).calls.is_empty());
    }

    #[test]
    fn a_template_is_harmony_by_its_markers() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/chat-templates/published"
        );
        let gpt_oss = std::fs::read_to_string(format!("{dir}/gpt-oss-120b.jinja")).unwrap();
        let qwen = std::fs::read_to_string(format!("{dir}/Qwen2.5-7B-Instruct.jinja")).unwrap();
        assert!(is_harmony(&gpt_oss));
        assert!(!is_harmony(&qwen));
    }
}
