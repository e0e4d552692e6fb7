use super::*;

const A: &str = "a";
const B: &str = "b";
const C: &str = "c";

fn gpus(n: u64) -> Amounts {
    [n * 1_000, 0, 0]
}

/// a: 4 GPUs, lends everything; b: 4 GPUs, borrows at most 2; c: 4 GPUs, lends only 1.
fn quotas() -> Quotas {
    let mut q = Quotas::default();
    q.set(A, Quota::gpus(4_000));
    q.set(
        B,
        Quota {
            borrowing_limit_milli: Some(2_000),
            ..Quota::gpus(4_000)
        },
    );
    q.set(
        C,
        Quota {
            lending_limit_milli: Some(1_000),
            ..Quota::gpus(4_000)
        },
    );
    q
}

#[test]
fn admission_follows_nominal_then_the_lendable_pool_within_limits() {
    struct Case {
        name: &'static str,
        usage: &'static [(&'static str, u64)],
        team: &'static str,
        gpus: u64,
        want: bool,
    }
    let cases = [
        Case {
            name: "within nominal",
            usage: &[],
            team: A,
            gpus: 4,
            want: true,
        },
        Case {
            name: "borrows what others lend: 4 (a) + 4 (b) + 1 (c)",
            usage: &[(A, 4_000)],
            team: A,
            gpus: 5,
            want: true,
        },
        Case {
            name: "c's guaranteed 3 GPUs are not lendable",
            usage: &[(A, 4_000)],
            team: A,
            gpus: 6,
            want: false,
        },
        Case {
            name: "cannot borrow what b uses",
            usage: &[(A, 4_000), (B, 2_000)],
            team: A,
            gpus: 4,
            want: false,
        },
        Case {
            name: "b's borrowing limit holds",
            usage: &[(B, 4_000)],
            team: B,
            gpus: 3,
            want: false,
        },
        Case {
            name: "b borrows within its limit",
            usage: &[(B, 4_000)],
            team: B,
            gpus: 2,
            want: true,
        },
        Case {
            name: "c within nominal even though a borrows c's lendable GPU",
            usage: &[(A, 9_000)],
            team: C,
            gpus: 4,
            want: true,
        },
        Case {
            name: "a team without quota may borrow",
            usage: &[],
            team: "d",
            gpus: 2,
            want: true,
        },
    ];
    for case in cases {
        let mut q = quotas();
        for (team, milli) in case.usage {
            q.charge(team, [*milli, 0, 0]);
        }
        assert_eq!(
            q.admits(case.team, gpus(case.gpus)),
            case.want,
            "{}",
            case.name
        );
        assert_eq!(
            q.refusal(case.team, gpus(case.gpus)).is_none(),
            case.want,
            "{}: the refusal explains exactly the refused",
            case.name
        );
    }
}

#[test]
fn cpu_quota_is_checked_like_gpus_and_refusals_name_the_resource() {
    let mut q = Quotas::default();
    q.set(
        A,
        Quota {
            cpu: Some(Limit {
                nominal: 8_000,
                borrowing_limit: Some(0),
                lending_limit: None,
            }),
            ..Quota::gpus(4_000)
        },
    );
    assert!(q.admits(A, [1_000, 8_000, 0]));
    let why = q.refusal(A, [1_000, 9_000, 0]).expect("over CPU");
    assert!(why.contains("CPU"), "{why}");
}

#[test]
fn fair_share_moves_borrowed_capacity_towards_the_team_borrowing_least() {
    // a and b lend 4 + 4 + 1 = 9 GPUs of pool; d has no quota.
    struct Case {
        name: &'static str,
        usage: &'static [(&'static str, u64)],
        taker: &'static str,
        victim: &'static str,
        want: bool,
    }
    let cases = [
        Case {
            name: "a borrows 4, b none: b may take 1 back",
            usage: &[(A, 8_000), (B, 4_000)],
            taker: B,
            victim: A,
            want: true,
        },
        Case {
            name: "and not the other way",
            usage: &[(A, 8_000), (B, 4_000)],
            taker: A,
            victim: B,
            want: false,
        },
        Case {
            name: "equal after the move is still fair (1 each)",
            usage: &[(A, 6_000), (B, 4_000)],
            taker: B,
            victim: A,
            want: true,
        },
        Case {
            name: "not when it would leave the taker above the victim",
            usage: &[(A, 5_000), (B, 4_000)],
            taker: B,
            victim: A,
            want: false,
        },
        Case {
            name: "no preemption of a team that would no longer borrow",
            usage: &[(A, 4_000), (B, 3_000)],
            taker: B,
            victim: A,
            want: false,
        },
    ];
    for case in cases {
        let mut q = quotas();
        for (team, milli) in case.usage {
            q.charge(team, [*milli, 0, 0]);
        }
        assert_eq!(
            q.fairer(case.taker, gpus(1), case.victim, gpus(1)),
            case.want,
            "{}",
            case.name
        );
    }
}

#[test]
fn changing_a_quota_keeps_the_pool_accounting_exact() {
    let mut q = quotas();
    q.charge(A, gpus(6));
    q.set(A, Quota::gpus(6_000));
    // a no longer borrows; the pool is 6 + 4 + 1 = 11 with a's 6 drawn on it.
    assert!(q.admits(B, gpus(5)));
    assert!(!q.admits(B, gpus(6)), "b's borrowing limit of 2");
    q.refund(A, gpus(6));
    assert_eq!(q.usage(A), 0);
    assert_eq!(q.pool_used, [0; 3]);
}
