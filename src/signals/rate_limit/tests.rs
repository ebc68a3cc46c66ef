//! The rate-limit fields' unit tests: each form read, hostile ones ignored.

use super::*;
use proptest::prelude::*;

proptest! {
    /// The one-pass check never skips fields the reader would read.
    #[test]
    fn the_quick_check_misses_nothing(
        fields in proptest::collection::vec(
            (
                prop::sample::select(vec![
                    "ratelimit", "ratelimit-policy", "x-ratelimit-remaining",
                    "x-ratelimit-reset", "date", "content-type", "retry-after",
                    "x-ratelimit", "ratelimits", "x-rate-limit-remaining",
                ]),
                "[0-9a-z;=, ]{0,20}",
            ),
            0..6,
        )
    ) {
        let mut h = HeaderMap::new();
        for (name, value) in &fields {
            h.append(
                http::HeaderName::from_static(name),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        if from_headers(&h, SystemTime::UNIX_EPOCH).is_some() {
            prop_assert!(has_fields(&h), "{fields:?}");
        }
    }
}

#[test]
fn the_quick_check_finds_each_field() {
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static("0"),
        );
        assert!(has_fields(&h), "{name}");
    }
    let mut h = HeaderMap::new();
    h.insert("content-type", http::HeaderValue::from_static("text/plain"));
    assert!(!has_fields(&h));
}

fn read(pairs: &[(&str, &str)]) -> Option<RateLimit> {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
        );
    }
    // Sun, 06 Nov 1994 08:49:37 GMT
    from_headers(
        &h,
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777),
    )
}

fn secs(n: u64) -> Option<Duration> {
    Some(Duration::from_secs(n))
}

#[test]
fn the_ietf_fields_are_read() {
    let got = read(&[
        ("ratelimit", r#""default";r=0;t=3"#),
        ("ratelimit-policy", r#""default";q=100;w=60"#),
    ])
    .unwrap();
    assert!(got.exhausted());
    assert_eq!(got.reset, secs(3));
    assert_eq!(got.quota, Some((100, Duration::from_secs(60))));
    assert_eq!(got.quota_rate(), Some(100.0 / 60.0));
    // Several policies: the tightest wins.
    let got = read(&[
        (
            "ratelimit",
            r#""burst";r=0;t=1, "day";r=0;t=3600, "x";r=7;t=9"#,
        ),
        (
            "ratelimit-policy",
            r#""burst";q=10;w=1, "day";q=1000;w=86400"#,
        ),
    ])
    .unwrap();
    assert_eq!((got.remaining, got.reset), (Some(0), secs(3600)));
    assert_eq!(got.quota, Some((1000, Duration::from_secs(86400))));
    // Other parameters and item types are skipped, not refused.
    let got = read(&[("ratelimit", r#"token;pk=:cHJvamVjdDEyMw==:;r=5;t=2;flag"#)]).unwrap();
    assert_eq!((got.remaining, got.reset), (Some(5), secs(2)));
}

#[test]
fn the_common_pair_is_read_in_seconds_or_as_a_unix_time() {
    let got = read(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")]).unwrap();
    assert_eq!((got.remaining, got.reset), (Some(0), secs(30)));
    // A Unix time, against the response's Date: ten seconds later.
    let got = read(&[
        ("date", "Tue, 01 Dec 2026 21:00:00 GMT"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "1796158810"),
    ])
    .unwrap();
    assert_eq!(got.reset, secs(10));
    // A Unix time in the past is now.
    let got = read(&[
        ("date", "Tue, 01 Dec 2026 21:00:00 GMT"),
        ("x-ratelimit-reset", "1000000000"),
    ])
    .unwrap();
    assert_eq!(got.reset, secs(0));
    // The IETF field wins over the pair.
    let got = read(&[("ratelimit", "a;r=4;t=1"), ("x-ratelimit-remaining", "0")]).unwrap();
    assert_eq!(got.remaining, Some(4));
}

#[test]
fn malformed_and_hostile_fields_are_ignored() {
    for value in [
        "",
        ",",
        "a;r=0;t=3,",
        r#""unterminated;r=0"#,
        "a;R=0",
        "a;r=0;t=9999999999999999",
        "a;r=0;t=99999999999999999999999999999999",
        "a;r=0 t=3",
        "a;r=0;;t=3",
        "(a b);r=0",
        "a;r=0;t=3 garbage",
        "\u{e9}=1;r=0",
    ] {
        let got = read(&[("ratelimit", value)]);
        assert!(got.is_none_or(|g| !g.exhausted()), "{value:?}: {got:?}");
    }
    for value in ["-1", "1.5", "soon", "99999999999999999999", " ", "0x10"] {
        let got = read(&[
            ("x-ratelimit-remaining", value),
            ("x-ratelimit-reset", value),
        ]);
        assert_eq!(got, None, "{value:?}");
    }
    // A negative or decimal parameter is not a count.
    let got = read(&[("ratelimit", "a;r=-1;t=2.5")]);
    assert_eq!(got, None);
    // Two copies that disagree are both ignored.
    let got = read(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-remaining", "5"),
    ]);
    assert_eq!(got, None);
    // The largest values never overflow; so far ahead, they are no time.
    assert_eq!(read(&[("x-ratelimit-reset", "999999999999999")]), None);
    let got = read(&[("ratelimit-policy", "a;q=5;w=0")]).unwrap();
    assert_eq!(got.quota_rate(), None);
}

proptest::proptest! {
    #[test]
    fn any_text_parses_or_is_ignored_without_panicking(
        a in ".*", b in ".*", c in ".*",
    ) {
        let mut h = HeaderMap::new();
        for (name, v) in [("ratelimit", &a), ("ratelimit-policy", &b), ("x-ratelimit-reset", &c)] {
            if let Ok(v) = http::HeaderValue::from_str(v) {
                h.insert(name, v);
            }
        }
        let _ = from_headers(&h, SystemTime::UNIX_EPOCH);
    }
}

/// With several policies, the spent one's reset is the reset, whatever
/// the order the server lists them in (issue 29, finding 6).
#[test]
fn the_spent_policys_reset_wins_in_any_order() {
    for field in [
        r#""hour";r=50;t=3000, "second";r=0;t=1"#,
        r#""second";r=0;t=1, "hour";r=50;t=3000"#,
    ] {
        let got = read(&[("ratelimit", field)]).unwrap();
        assert_eq!((got.remaining, got.reset), (Some(0), secs(1)), "{field}");
    }
    // None spent: the reset of the one with the fewest units left.
    for field in [r#"a;r=50;t=3000, b;r=2;t=1"#, r#"b;r=2;t=1, a;r=50;t=3000"#] {
        let got = read(&[("ratelimit", field)]).unwrap();
        assert_eq!((got.remaining, got.reset), (Some(2), secs(1)), "{field}");
    }
}

/// A reset that cannot be a time is ignored: epoch milliseconds (read as
/// seconds, tens of thousands of years ahead), or a Unix time years ahead
/// (issue 29, finding 1).
#[test]
fn a_reset_that_cannot_be_a_time_is_ignored() {
    for reset in ["1796158810000", "1796158810", "4102444800"] {
        let got = read(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
        ])
        .unwrap();
        assert_eq!((got.remaining, got.reset), (Some(0), None), "{reset}");
    }
    // Seconds from now are a time up to a year ahead.
    let got = read(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "86400"),
    ])
    .unwrap();
    assert_eq!(got.reset, secs(86_400));
    let got = read(&[("ratelimit", r#"d;r=0;t=900000000"#)]).unwrap();
    assert_eq!(got.reset, None);
}

/// RFC 9651 §4.2.3.2: a parameter key that appears again overwrites the
/// value it had, keeping its first place (parameters are an ordered map,
/// as a dictionary is, §4.2.2): the last value wins.
#[test]
fn a_repeated_parameter_is_its_last_value() {
    let got = read(&[("ratelimit", r#""a";r=5;r=0;t=3"#)]).unwrap();
    assert_eq!((got.remaining, got.reset), (Some(0), secs(3)));
    let got = read(&[("ratelimit", r#""a";t=60;r=0;t=3"#)]).unwrap();
    assert_eq!((got.remaining, got.reset), (Some(0), secs(3)));
    let got = read(&[("ratelimit-policy", r#""a";q=100;w=60;q=10"#)]).unwrap();
    assert_eq!(got.quota, Some((10, Duration::from_secs(60))));
    // A last value that is not a count leaves none: the member says
    // nothing of `r` (a boolean true, `r`, is the last value here).
    let got = read(&[("ratelimit", r#""a";r=0;t=3;r, "b";r=7;t=1"#)]).unwrap();
    assert_eq!((got.remaining, got.reset), (Some(7), secs(1)));
    // A field repeated is not a parameter repeated: its lines are one
    // list (RFC 9651 §4.2), each member read, the tightest winning.
    let got = read(&[("ratelimit", "a;r=5"), ("ratelimit", "a;r=0")]);
    assert_eq!(got, read(&[("ratelimit", "a;r=5, a;r=0")]));
    assert_eq!(got.unwrap().remaining, Some(0));
}

/// The parameters of RFC 9651's own examples of lists (§3.1, §3.1.2,
/// §4.2.1's whitespace) and of its ordered-map rule for duplicates, read
/// as the parser sees them: each key once, in the order it first
/// appeared, with its last value.
#[test]
fn the_parameters_of_the_rfcs_examples() {
    type Owned = Vec<(String, Option<u64>)>;
    let params = |field: &str| -> Option<Vec<Owned>> {
        let owned =
            |(_, p): (u64, Params<'_>)| p.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        parse_list(field).map(|members| members.into_iter().map(owned).collect())
    };
    let p = |pairs: &[(&str, Option<u64>)]| -> Owned {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    };
    // §3.1: `Example-List: sugar, tea, rum`.
    assert_eq!(
        params("sugar, tea, rum"),
        Some(vec![vec![], vec![], vec![]])
    );
    // §3.1.2's `abc;a=1;b=2; cde_456, (ghi;jk=4 l);q="9";r=w`: its
    // first member (`cde_456` is a third parameter, a boolean, after the
    // space `;` allows); the second is an inner list, which no rate-limit
    // field holds, and the field is then ignored whole.
    assert_eq!(
        params("abc;a=1;b=2; cde_456"),
        Some(vec![p(&[
            ("a", Some(1)),
            ("b", Some(2)),
            ("cde_456", None)
        ])])
    );
    assert_eq!(
        params(r#"abc;a=1;b=2; cde_456, (ghi;jk=4 l);q="9";r=w"#),
        None
    );
    // §3.1.2: `Example-Integer: 1; a; b=?0` (a boolean is no count).
    assert_eq!(
        params("1; a; b=?0"),
        Some(vec![p(&[("a", None), ("b", None)])])
    );
    // Duplicates: the last value, at the first place (§4.2.3.2), as the
    // dictionary `a=1,b=2,a=3` is `a=3, b=2` (§4.2.2).
    assert_eq!(
        params("x;a=1;b=2;a=3"),
        Some(vec![p(&[("a", Some(3)), ("b", Some(2))])])
    );
    assert_eq!(
        params("x;a=1;a;b=2"),
        Some(vec![p(&[("a", None), ("b", Some(2))])])
    );
    // Repeats never grow a member: a hostile field of one key repeated is
    // one parameter.
    let repeated = format!("x{}", ";a=1".repeat(1000));
    assert_eq!(params(&repeated), Some(vec![p(&[("a", Some(1))])]));
    // What the grammar rejects stays rejected: whitespace before `;` or
    // around `=`, an uppercase key (§3.1.2, §4.2.3.3).
    for field in ["abc ;a=1", "abc;a =1", "abc;a= 1", "abc;A=1"] {
        assert_eq!(params(field), None, "{field}");
    }
}

/// RFC 9651 §4.2: a list field sent on several lines is one list, as
/// gateways with one limiter each send them (issue 51: two lines were
/// taken for a disagreement and both ignored).
#[test]
fn a_list_on_several_lines_is_one_list() {
    let one_line = read(&[
        ("ratelimit", r#""burst";r=0;t=5, "daily";r=900;t=3600"#),
        (
            "ratelimit-policy",
            r#""burst";q=10;w=5, "daily";q=1000;w=86400"#,
        ),
    ])
    .unwrap();
    let two_lines = read(&[
        ("ratelimit", r#""burst";r=0;t=5"#),
        ("ratelimit", r#""daily";r=900;t=3600"#),
        ("ratelimit-policy", r#""burst";q=10;w=5"#),
        ("ratelimit-policy", r#""daily";q=1000;w=86400"#),
    ])
    .unwrap();
    assert_eq!(two_lines, one_line);
    assert_eq!(two_lines.remaining, Some(0));
    assert_eq!(two_lines.reset, secs(5));
    assert_eq!(two_lines.quota, Some((1000, Duration::from_secs(86_400))));
    // A line that does not parse spoils the list, as it would on one line.
    let spoiled = read(&[("ratelimit", r#""burst";r=0;t=5"#), ("ratelimit", "(x")]);
    assert_eq!(spoiled, None);
    // The X-RateLimit pair are singletons: two that disagree are none.
    let got = read(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-remaining", "3"),
    ]);
    assert_eq!(got, None);
}

/// The policy a limit's numbers come from is kept by name: two named
/// policies are two limits, one name on two answers is one.
#[test]
fn the_spent_policys_name_is_kept() {
    let id = |field: &str| read(&[("ratelimit", field)]).unwrap().policy_id();
    assert_eq!(id(r#""search";r=0;t=30"#), id(r#""search";r=0;t=3"#));
    assert_ne!(id(r#""search";r=0;t=30"#), id(r#""export";r=0;t=30"#));
    assert!(id(r#""search";r=0;t=30"#).is_some());
    // The spent one's name, in either order.
    let both = |a: &str, b: &str| id(&format!("{a}, {b}"));
    let (spent, open) = (r#""search";r=0;t=30"#, r#""daily";r=9;t=99"#);
    assert_eq!(both(spent, open), id(spent));
    assert_eq!(both(open, spent), id(spent));
    // The common pair names no policy.
    let pair = read(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")]).unwrap();
    assert_eq!(pair.policy_id(), None);
}
