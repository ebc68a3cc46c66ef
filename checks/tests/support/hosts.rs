//! Names in the system's hosts file, for the tests that go through the
//! real system resolver (`getaddrinfo`) with a name of several addresses.
//! The lines are added when missing and removed again when the guard
//! drops; the tests run as root (as CI does), and say so plainly when the
//! file cannot be written.
#![allow(dead_code, unreachable_pub)]

use std::fs;

const HOSTS: &str = "/etc/hosts";

/// The lines this guard added, removed when it drops.
pub struct Hosts {
    added: Vec<String>,
}

/// Adds each `(address, name)` line to the hosts file unless it is there.
pub fn add(entries: &[(&str, &str)]) -> Hosts {
    let text = fs::read_to_string(HOSTS).expect("read /etc/hosts");
    let present: Vec<&str> = text.lines().map(str::trim).collect();
    let added: Vec<String> = entries
        .iter()
        .map(|(addr, name)| format!("{addr} {name}"))
        .filter(|line| !present.contains(&line.as_str()))
        .collect();
    if !added.is_empty() {
        let mut text = text.clone();
        if !text.ends_with('\n') && !text.is_empty() {
            text.push('\n');
        }
        for line in &added {
            text.push_str(line);
            text.push('\n');
        }
        fs::write(HOSTS, text).unwrap_or_else(|e| {
            panic!(
                "this test resolves names through the system resolver and adds \
                 them to {HOSTS}, which needs root ({e}); add these lines by \
                 hand to run it: {added:#?}"
            )
        });
    }
    Hosts { added }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let Ok(text) = fs::read_to_string(HOSTS) else {
            return;
        };
        let kept: String = text
            .lines()
            .filter(|l| !self.added.iter().any(|a| a == l.trim()))
            .map(|l| format!("{l}\n"))
            .collect();
        let _ = fs::write(HOSTS, kept);
    }
}
