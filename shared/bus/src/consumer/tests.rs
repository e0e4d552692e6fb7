use super::skipped_delivery;

#[test]
fn a_gap_in_the_delivery_sequence_is_found_and_a_repeat_is_not_one() {
    struct Case {
        name: &'static str,
        next: Option<u64>,
        dseqs: Vec<u64>,
        want: Option<(u64, u64)>,
        want_next: Option<u64>,
    }
    let cases = [
        Case {
            name: "deliveries in a row from a fresh consumer",
            next: Some(1),
            dseqs: vec![1, 2, 3],
            want: None,
            want_next: Some(4),
        },
        Case {
            name: "deliveries 2 and 3 never arrived",
            next: Some(2),
            dseqs: vec![4, 5],
            want: Some((2, 4)),
            want_next: Some(6),
        },
        Case {
            name: "a gap inside a batch",
            next: Some(1),
            dseqs: vec![1, 2, 7],
            want: Some((3, 7)),
            want_next: Some(8),
        },
        Case {
            name: "an existing consumer: the first delivery sets the count",
            next: None,
            dseqs: vec![41, 42],
            want: None,
            want_next: Some(43),
        },
        Case {
            name: "a new consumer leader that re-delivers what its predecessor had",
            next: Some(10),
            dseqs: vec![9, 10, 11],
            want: None,
            want_next: Some(12),
        },
    ];
    for case in cases {
        let mut next = case.next;
        let got = skipped_delivery(&mut next, case.dseqs);
        assert_eq!(got, case.want, "{}", case.name);
        assert_eq!(next, case.want_next, "{}", case.name);
    }
}
