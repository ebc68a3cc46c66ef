//! A fork child never repeats its parent's keys: the generator's state is
//! the kernel's, which a fork wipes. A generator seeded once in process
//! memory fails this test: parent and child go on with the same sequence.
#![cfg(unix)]

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::FromRawFd;

use reqwest_safe_retry::keys::KeyGenerator;
use reqwest_safe_retry::IdempotencyKey;

const KEYS: usize = 1000;

fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| IdempotencyKey::generate(KeyGenerator::UuidV4).into_string())
        .collect()
}

#[test]
fn a_fork_child_does_not_repeat_its_parents_keys() {
    // The thread's generator state exists before the fork, so the child
    // inherits it.
    let before = keys(10);
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let [read_fd, write_fd] = fds;
    // SAFETY: the child only generates keys, writes them to the pipe and
    // leaves with `_exit`, running no destructor and no test harness code.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let text = keys(KEYS).join("\n");
        let mut written = 0;
        while written < text.len() {
            // SAFETY: the pointer and length are within `text`.
            let n = unsafe {
                libc::write(
                    write_fd,
                    text[written..].as_ptr().cast(),
                    text.len() - written,
                )
            };
            if n <= 0 {
                // SAFETY: leaving the child at once is what `_exit` is for.
                unsafe { libc::_exit(1) };
            }
            written += n.unsigned_abs();
        }
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent's copy of the write end is its own to close.
    unsafe { libc::close(write_fd) };
    let parent = keys(KEYS);
    let mut child = String::new();
    // SAFETY: `read_fd` is an open descriptor this process owns from here on.
    unsafe { std::fs::File::from_raw_fd(read_fd) }
        .read_to_string(&mut child)
        .unwrap();
    let mut status = 0;
    // SAFETY: `pid` is this process's child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);

    let child: Vec<&str> = child.lines().collect();
    assert_eq!(child.len(), KEYS);
    let mut seen: HashSet<&str> = before.iter().map(String::as_str).collect();
    seen.extend(parent.iter().map(String::as_str));
    assert_eq!(seen.len(), KEYS + 10, "the parent repeated a key");
    for key in child {
        assert!(
            seen.insert(key),
            "the child repeated the parent's key {key}"
        );
    }
}
