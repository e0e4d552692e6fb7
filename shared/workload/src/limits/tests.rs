//! The size limit and UTF-8, as `allot validate` reports them.

use super::*;

#[test]
fn text_refuses_too_many_bytes_before_looking_at_them() {
    let problem = text(vec![0xff; MAX_SPEC_BYTES + 1]).unwrap_err();
    assert_eq!(
        problem.to_string(),
        "the spec is 524289 bytes; at most 524288 bytes (512 KiB), so the submission fits in \
         one NATS message — split the workload"
    );
    assert_eq!(problem.kind, ProblemKind::TooLarge);
    assert_eq!(
        too_large(SpecSize::MoreThan(524_288)).to_string(),
        "the spec is more than 524288 bytes (reading stopped there); at most 524288 bytes \
         (512 KiB), so the submission fits in one NATS message — split the workload"
    );
}

#[test]
fn text_names_the_first_byte_that_is_not_utf8_and_where_it_is() {
    let problem = text(b"apiVersion: allot/v1\nkind: W\xe9rkload\n".to_vec()).unwrap_err();
    assert_eq!(
        problem.to_string(),
        "not UTF-8 at byte 29 (0xe9): a spec is UTF-8 text (was it saved as Latin-1 or \
         UTF-16?) at line 2 column 8"
    );
    assert_eq!(text("kind: Wörkload".into()).unwrap(), "kind: Wörkload");
}
