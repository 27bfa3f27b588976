//! Chat templates rendered in child processes. A template comes with the
//! model, and minijinja bounds the steps a rendering runs and the output it
//! writes, but not the values it builds: `{% set ns.s = ns.s ~ ns.s %}`
//! forty times over asks for a terabyte in one allocation, and a failed
//! allocation aborts the process that asked. No bound inside the engine
//! covers every operator, filter and method, so the server renders each
//! conversation in a child of its own (the `cleave` binary's hidden
//! `render-chat` command) under a memory limit and a deadline: a template
//! that passes them fails its request with a 400 that names the bound, and
//! the server goes on.
//!
//! At shutdown, renderings still waiting for their turn are refused at
//! once, and those running are ended when the shutdown deadline passes:
//! each of their clients gets a 503, none waits on the others' templates.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::api::{ApiError, Message};
use crate::chat::ChatTemplate;

/// What each rendering may use, and how many may run at once.
#[derive(Clone, Copy, Debug)]
pub struct RenderLimits {
    /// Data memory a rendering may hold beside its request, which it may
    /// hold several times over (its JSON, the messages parsed from it,
    /// copies the template makes): the prompt of up to 16 MiB, with room
    /// to spare for the template's own values.
    pub memory: u64,
    /// How long one rendering may take. The template's step bound stops a
    /// runaway loop well within it; this also stops a step that is slow on
    /// its own (a huge replace).
    pub deadline: Duration,
    /// Renderings at once: each may hold its memory.
    pub at_once: usize,
}

impl Default for RenderLimits {
    /// 256 MiB and 10 s each, as many at once as there are cores.
    fn default() -> Self {
        RenderLimits {
            memory: 256 << 20,
            deadline: Duration::from_secs(10),
            at_once: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

impl RenderLimits {
    /// The data memory of a rendering whose request is `request_bytes`.
    fn memory_for(&self, request_bytes: usize) -> u64 {
        self.memory.saturating_add((request_bytes as u64).saturating_mul(8))
    }
}

/// The exit status of a child that refused the conversation (the template
/// raised an exception, ran out of steps, ...); its message is on stderr.
const REFUSED: i32 = 2;

/// What the child is sent on stdin.
#[derive(Serialize, Deserialize)]
struct RenderRequest<'a> {
    template: Option<Cow<'a, str>>,
    bos_token: Cow<'a, str>,
    eos_token: Cow<'a, str>,
    messages: Cow<'a, [Message]>,
    tools: Option<Cow<'a, serde_json::Value>>,
}

/// A model's chat template, rendered by child processes of `program`
/// (`args` select its `render-chat` command).
pub struct ChatRenderer {
    template: ChatTemplate,
    program: PathBuf,
    args: Vec<String>,
    limits: RenderLimits,
    slots: Slots,
    /// Set past the shutdown deadline: running renderings are ended.
    ending: AtomicBool,
}

impl ChatRenderer {
    /// Renders `template` (already compiled, so that a broken one failed
    /// at start-up) with `program args MEMORY SECONDS`, within `limits`.
    pub fn new(template: ChatTemplate, program: PathBuf, args: Vec<String>, limits: RenderLimits) -> Self {
        ChatRenderer {
            template,
            program,
            args,
            limits,
            slots: Slots::new(limits.at_once.max(1)),
            ending: AtomicBool::new(false),
        }
    }

    /// At shutdown: renderings waiting for their turn are refused (a 503),
    /// and no new one starts.
    pub fn stop_waiting(&self) {
        self.slots.close();
    }

    /// Past the shutdown deadline: running renderings are ended, their
    /// children killed, and refused (a 503).
    pub fn end_running(&self) {
        self.stop_waiting();
        self.ending.store(true, Ordering::Relaxed);
    }

    /// The prompt for `messages` (and the functions `tools` declares),
    /// ending where the assistant's answer begins; a 400 naming the bound
    /// when the template passes one.
    pub fn render(&self, messages: &[Message], tools: Option<&serde_json::Value>) -> Result<String, ApiError> {
        let (template, bos_token, eos_token) = self.template.parts();
        let request = serde_json::to_vec(&RenderRequest {
            template: template.map(Cow::Borrowed),
            bos_token: Cow::Borrowed(bos_token),
            eos_token: Cow::Borrowed(eos_token),
            messages: Cow::Borrowed(messages),
            tools: tools.map(Cow::Borrowed),
        })
        .map_err(|e| ApiError::internal(format!("cannot send the messages to the chat template: {e}")))?;
        let memory = self.limits.memory_for(request.len());
        let deadline = self.limits.deadline;
        let _slot = self.slots.take().ok_or_else(ApiError::shutting_down)?;
        let mut child = Command::new(&self.program)
            .args(&self.args)
            // CPU time a second past the deadline: the deadline acts
            // first, this ends a child whose parent has gone.
            .args([memory.to_string(), (deadline.as_secs() + 1).to_string()])
            // An abort should end the child at once, not print a backtrace.
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                ApiError::internal(format!(
                    "cannot start the chat template's renderer ({}): {e}",
                    self.program.display()
                ))
            })?;
        let stdin = child.stdin.take();
        // A child that ended early leaves the write failing: its status
        // says why.
        let writer = std::thread::spawn(move || stdin.map(|mut pipe| pipe.write_all(&request)));
        let stdout = read_in_background(child.stdout.take());
        let stderr = read_in_background(child.stderr.take());
        let waited = wait_until(&mut child, Instant::now() + deadline, &self.ending);
        let _ = writer.join();
        let (stdout, stderr) = (joined(stdout), joined(stderr));
        let refused = |why: String| ApiError::invalid(why, Some("messages".into()));
        let status = match waited {
            Waited::Exited(status) => status,
            Waited::PastDeadline => {
                return Err(refused(format!(
                    "the chat template ran past its deadline of {} s on these messages",
                    deadline.as_secs_f32()
                )))
            }
            Waited::Ended => return Err(ApiError::shutting_down()),
        };
        let said = String::from_utf8_lossy(&stderr).trim().to_string();
        if status.success() {
            return String::from_utf8(stdout).map_err(|_| refused("the chat template wrote invalid UTF-8".into()));
        }
        if status.code() == Some(REFUSED) {
            return Err(refused(said));
        }
        Err(match stopped_by(&said, memory) {
            Some(bound) => refused(bound),
            None => ApiError::internal(format!("the chat template's renderer ended with {status}: {said}")),
        })
    }
}

/// Which bound stopped a child that ended abnormally, from what it said.
fn stopped_by(said: &str, memory: u64) -> Option<String> {
    if said.contains("memory allocation of") {
        Some(format!(
            "the chat template built more than its bound of {} MiB on these messages",
            memory >> 20
        ))
    } else if said.contains("overflowed its stack") {
        Some("the chat template nested or recursed too deep on these messages".into())
    } else {
        None
    }
}

/// How waiting for a child ended.
enum Waited {
    Exited(ExitStatus),
    /// Still running at its deadline: killed.
    PastDeadline,
    /// Still running when `ending` was set: killed.
    Ended,
}

/// Waits for the child until it ends, `deadline` passes or `ending` is
/// set, and kills it in the last two cases.
fn wait_until(child: &mut Child, deadline: Instant, ending: &AtomicBool) -> Waited {
    let mut pause = Duration::from_millis(1);
    let waited = loop {
        match child.try_wait() {
            Ok(Some(status)) => return Waited::Exited(status),
            _ if ending.load(Ordering::Relaxed) => break Waited::Ended,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            _ => break Waited::PastDeadline,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    waited
}

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

fn joined(reader: JoinHandle<Vec<u8>>) -> Vec<u8> {
    reader.join().unwrap_or_default()
}

/// A count of renderings that may run at once, until it is closed.
struct Slots {
    state: Mutex<SlotState>,
    changed: Condvar,
}

struct SlotState {
    free: usize,
    closed: bool,
}

impl Slots {
    fn new(n: usize) -> Self {
        Slots {
            state: Mutex::new(SlotState { free: n, closed: false }),
            changed: Condvar::new(),
        }
    }

    /// Waits for a free slot, given back when the guard drops; `None` once
    /// the slots are closed, whether it waited or not.
    fn take(&self) -> Option<SlotGuard<'_>> {
        let lock = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut state = self
            .changed
            .wait_while(lock, |s| s.free == 0 && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return None;
        }
        state.free -= 1;
        Some(SlotGuard(self))
    }

    /// Refuses every waiter, and every later one.
    fn close(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        self.changed.notify_all();
    }
}

struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner).free += 1;
        self.0.changed.notify_one();
    }
}

/// The `render-chat` command, in the child: reads one [`RenderRequest`] as
/// JSON from stdin, and writes its prompt to stdout (exit 0) or why the
/// template refused it to stderr (exit 2), holding at most `memory` bytes
/// of data and `cpu_seconds` of CPU time.
pub fn render_chat_command(memory: u64, cpu_seconds: u64) -> ExitCode {
    limit_this_process(memory, cpu_seconds);
    let refuse = |why: &str| {
        eprintln!("{why}");
        ExitCode::from(REFUSED as u8)
    };
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        return refuse(&format!("cannot read the rendering request: {e}"));
    }
    let request: RenderRequest = match serde_json::from_slice(&input) {
        Ok(request) => request,
        Err(e) => return refuse(&format!("the rendering request is not valid: {e}")),
    };
    drop(input);
    let template = match ChatTemplate::new(
        request.template.as_deref(),
        request.bos_token.into_owned(),
        request.eos_token.into_owned(),
    ) {
        Ok(template) => template,
        Err(e) => return refuse(&e),
    };
    match template.render(&request.messages, request.tools.as_deref()) {
        Ok(prompt) => match std::io::stdout().lock().write_all(prompt.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => refuse(&format!("cannot write the prompt: {e}")),
        },
        Err(e) => refuse(&e.message),
    }
}

/// Caps this process's data (heap and private mappings), CPU time and
/// core dumps, where the system has such limits. A limit that cannot be
/// set (a lower one already holds) is left as it is.
#[cfg(unix)]
fn limit_this_process(memory: u64, cpu_seconds: u64) {
    let set = |resource, value: u64| {
        let limit = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct it is given and nothing else.
        unsafe { libc::setrlimit(resource, &limit) };
    };
    set(libc::RLIMIT_DATA, memory);
    set(libc::RLIMIT_CPU, cpu_seconds);
    set(libc::RLIMIT_CORE, 0);
}

/// Elsewhere the child still keeps a failed rendering from the server,
/// without a limit of its own.
#[cfg(not(unix))]
fn limit_this_process(_memory: u64, _cpu_seconds: u64) {}
