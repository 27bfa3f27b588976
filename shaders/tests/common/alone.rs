//! One test in a process of its own, for tests that read the counters of
//! `cleave_shaders::profile`: they count the whole process, so every test
//! running beside one in the same binary would move its figures.

use std::process::Command;

/// Set in the child process that runs the test alone.
const CHILD: &str = "CLEAVE_TEST_ALONE";

/// In the test harness: runs the calling test again in a child process
/// that runs nothing else, fails if it fails there, and returns true (the
/// test is done). In that child: returns false, and the test goes on.
/// The test is the calling thread's: the harness names each test's thread
/// by the test's path.
pub fn ran_alone() -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let thread = std::thread::current();
    let name = thread.name().expect("the test harness names each test's thread");
    let binary = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(binary)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name}, alone in a process, did not pass:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    true
}
