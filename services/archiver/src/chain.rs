//! The archive's hash chain: its table, the exact bytes each record's hash covers, appending
//! (idempotent, with the consumer's position in the same transaction) and verification.
//!
//! # Format (version 1)
//!
//! Table `records`, one row per stream message, walked in `position` order:
//!
//! | column         | type            | meaning                                                   |
//! |----------------|-----------------|-----------------------------------------------------------|
//! | `position`     | INTEGER PK      | where the record sits in the archive: 1, 2, 3 … (not hashed; the chain itself fixes the order) |
//! | `seq`          | INTEGER UNIQUE  | the message's stream sequence                             |
//! | `subject`      | TEXT            | the subject it was published on                           |
//! | `headers`      | TEXT            | its headers, canonical JSON (below)                       |
//! | `payload`      | BLOB            | its payload bytes, as published                           |
//! | `published_ns` | INTEGER         | when the server stored it, Unix nanoseconds               |
//! | `archived_ns`  | INTEGER         | when the archiver stored it, Unix nanoseconds             |
//! | `prev_hash`    | BLOB (32)       | the previous record's `hash`; 32 zero bytes for the first |
//! | `hash`         | BLOB (32)       | SHA-256 of the encoding below                             |
//!
//! `hash = SHA-256(field("allot.archive.v1") ‖ prev_hash ‖ be64(seq) ‖ be64(published_ns) ‖
//! be64(archived_ns) ‖ field(subject) ‖ field(headers) ‖ field(payload))`, where `be64` is the
//! 8-byte big-endian two's-complement integer, `field(b) = be64(len(b)) ‖ b`, `prev_hash` is
//! its 32 raw bytes, and text is its UTF-8 bytes. Every variable-length part carries its length
//! and every other part has a fixed width, so no two different records encode to the same
//! bytes. `headers` is a JSON array of `[name, value]` pairs sorted by name (byte order, values
//! of one name in the order received), with no whitespace: `[["Nats-Msg-Id","…"]]`, or `[]`.
//! The hash covers the stored text as it is, so a verifier never needs to re-serialise it.

use std::fmt;

use allot_store::rusqlite::{
    self, Connection, OptionalExtension, TransactionBehavior, types::ValueRef,
};
use sha2::{Digest, Sha256};

#[cfg(test)]
mod tests;

/// A record's SHA-256.
pub type Hash = [u8; 32];

/// The `prev_hash` of the first record.
pub const GENESIS: Hash = [0; 32];

/// The format tag, the first thing every record's hash covers.
pub const FORMAT: &str = "allot.archive.v1";

/// The archive's schema, after allot-store's own (`applied_positions`).
pub const MIGRATIONS: &[&str] = &["CREATE TABLE records (
    position     INTEGER PRIMARY KEY,
    seq          INTEGER NOT NULL UNIQUE,
    subject      TEXT    NOT NULL,
    headers      TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    published_ns INTEGER NOT NULL,
    archived_ns  INTEGER NOT NULL,
    prev_hash    BLOB    NOT NULL,
    hash         BLOB    NOT NULL
) STRICT;"];

/// One message to archive, as the stream holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Stream sequence.
    pub seq: u64,
    /// Subject it was published on.
    pub subject: String,
    /// Headers, canonical JSON (see [`canonical_headers`]).
    pub headers: String,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// When the server stored it, Unix nanoseconds.
    pub published_ns: i64,
}

/// The canonical JSON of a message's headers: `[name, value]` pairs sorted by name, values of
/// one name in the order received; `[]` when there are none.
pub fn canonical_headers<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
    // Stable, so the values of one name keep their order.
    pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    serde_json::to_string(&pairs).expect("string pairs always serialise")
}

/// The hash of one record, over the encoding in the module docs.
pub fn record_hash(
    prev_hash: &[u8],
    seq: u64,
    published_ns: i64,
    archived_ns: i64,
    subject: &[u8],
    headers: &[u8],
    payload: &[u8],
) -> Hash {
    fn field(h: &mut Sha256, bytes: &[u8]) {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    let mut h = Sha256::new();
    field(&mut h, FORMAT.as_bytes());
    h.update(prev_hash);
    h.update(seq.to_be_bytes());
    h.update(published_ns.to_be_bytes());
    h.update(archived_ns.to_be_bytes());
    field(&mut h, subject);
    field(&mut h, headers);
    field(&mut h, payload);
    h.finalize().into()
}

/// The last record of the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Its position (1-based).
    pub position: u64,
    /// Its stream sequence.
    pub seq: u64,
    /// Its hash: the hash of the whole chain.
    pub hash: Hash,
}

/// The archive's last record, if it has any.
pub fn head(conn: &Connection) -> Result<Option<Head>, rusqlite::Error> {
    conn.query_row(
        "SELECT position, seq, hash FROM records ORDER BY position DESC LIMIT 1",
        [],
        |row| {
            let hash: Vec<u8> = row.get(2)?;
            Ok(Head {
                position: row.get::<_, i64>(0)? as u64,
                seq: row.get::<_, i64>(1)? as u64,
                hash: hash.try_into().unwrap_or(GENESIS),
            })
        },
    )
    .optional()
}

/// What [`append`] did with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Added as the new head, with this hash.
    Added(Hash),
    /// Already archived, identical: nothing changed (a redelivery).
    AlreadyArchived,
}

/// Why [`append`] refused an entry. The archive is unchanged by it; entries before it in the
/// batch are kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The archive holds a different message at this sequence: the stream and the archive
    /// disagree about history, which only tampering (with one or the other) explains.
    #[error("the archive holds a different message at seq {seq} (its {field} differs)")]
    Conflict {
        /// The sequence.
        seq: u64,
        /// The first field that differs.
        field: &'static str,
    },
    /// The entry does not follow the head: archiving it would leave a hole in the chain.
    #[error(
        "seq {seq} does not follow the archive's head (seq {head}); restart the archiver to re-read from seq {}",
        head + 1
    )]
    Gap {
        /// The archive's last sequence.
        head: u64,
        /// The refused sequence.
        seq: u64,
    },
    /// The entry is older than the archive's first record.
    #[error("seq {seq} is before the archive's first record (seq {first})")]
    BeforeStart {
        /// The refused sequence.
        seq: u64,
        /// The archive's first sequence.
        first: u64,
    },
}

/// Appends `entries` (in stream order) for `consumer`, archived at `archived_ns`.
///
/// One `IMMEDIATE` transaction holds the new records and `consumer`'s position (the new head's
/// sequence, through [`allot_store::record_position`]), so a crash keeps both or neither. An
/// entry whose sequence is already archived is a no-op if it is identical and
/// [`Refused::Conflict`] if not; an entry that does not follow the head is
/// [`Refused::Gap`]. The outer error is SQLite's (nothing was kept; retry).
pub fn append(
    conn: &mut Connection,
    consumer: &str,
    entries: &[Entry],
    archived_ns: i64,
) -> Result<Vec<Result<Appended, Refused>>, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut head = head(&tx)?;
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut added = false;
    {
        let mut stored = tx.prepare_cached(
            "SELECT subject, headers, payload, published_ns FROM records WHERE seq = ?1",
        )?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO records (position, seq, subject, headers, payload, published_ns,
                                  archived_ns, prev_hash, hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for e in entries {
            let outcome = match head {
                Some(h) if e.seq <= h.seq => {
                    let found = stored
                        .query_row([e.seq as i64], |row| {
                            Ok((
                                row.get::<_, String>(0)?,
                                row.get::<_, String>(1)?,
                                row.get::<_, Vec<u8>>(2)?,
                                row.get::<_, i64>(3)?,
                            ))
                        })
                        .optional()?;
                    match found {
                        None => Err(Refused::BeforeStart {
                            seq: e.seq,
                            first: first_seq(&tx)?.unwrap_or(h.seq),
                        }),
                        Some((subject, headers, payload, published_ns)) => {
                            let field = if subject != e.subject {
                                Some("subject")
                            } else if headers != e.headers {
                                Some("headers")
                            } else if payload != e.payload {
                                Some("payload")
                            } else if published_ns != e.published_ns {
                                Some("publication time")
                            } else {
                                None
                            };
                            match field {
                                Some(field) => Err(Refused::Conflict { seq: e.seq, field }),
                                None => Ok(Appended::AlreadyArchived),
                            }
                        }
                    }
                }
                Some(h) if e.seq != h.seq + 1 => Err(Refused::Gap {
                    head: h.seq,
                    seq: e.seq,
                }),
                _ => {
                    let prev = head.map_or(GENESIS, |h| h.hash);
                    let position = head.map_or(1, |h| h.position + 1);
                    let hash = record_hash(
                        &prev,
                        e.seq,
                        e.published_ns,
                        archived_ns,
                        e.subject.as_bytes(),
                        e.headers.as_bytes(),
                        &e.payload,
                    );
                    insert.execute(rusqlite::params![
                        position as i64,
                        e.seq as i64,
                        e.subject,
                        e.headers,
                        e.payload,
                        e.published_ns,
                        archived_ns,
                        &prev[..],
                        &hash[..],
                    ])?;
                    head = Some(Head {
                        position,
                        seq: e.seq,
                        hash,
                    });
                    added = true;
                    Ok(Appended::Added(hash))
                }
            };
            outcomes.push(outcome);
        }
    }
    if let (true, Some(h)) = (added, head) {
        allot_store::record_position(&tx, consumer, h.seq)?;
    }
    tx.commit()?;
    Ok(outcomes)
}

fn first_seq(conn: &Connection) -> Result<Option<u64>, rusqlite::Error> {
    conn.query_row(
        "SELECT seq FROM records ORDER BY position LIMIT 1",
        [],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|s| s.map(|s| s as u64))
}

/// What an auditor was told about the archive earlier and wants to hold it to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expect {
    /// A head hash the auditor was given: the chain must still pass through it (records
    /// appended after it are fine — the log grows).
    pub head: Option<Hash>,
    /// How many records the archive held then: it must hold at least that many, and with
    /// `head`, the record at that position must be the pinned head.
    pub count: Option<u64>,
}

/// A chain that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Records in the archive.
    pub records: u64,
    /// Sequence of the first record.
    pub first_seq: Option<u64>,
    /// Sequence of the last record.
    pub last_seq: Option<u64>,
    /// Hash of the last record ([`GENESIS`] for an empty archive).
    pub head: Hash,
    /// Where the pinned head ([`Expect::head`]) was found: (position, seq).
    pub pinned: Option<(u64, u64)>,
}

/// A record, as the verifier names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRef {
    /// Its position in the archive.
    pub position: u64,
    /// Its stream sequence, as stored.
    pub seq: u64,
    /// Its subject, as stored (lossy if it is not UTF-8).
    pub subject: String,
}

/// The first thing wrong with an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// The first bad record; `None` when the fault is not one record's (unreadable file,
    /// an expectation about the whole archive on an empty one).
    pub record: Option<RecordRef>,
    /// What is wrong.
    pub fault: Fault,
}

/// What is wrong with a record (or the archive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The record no longer hashes to its stored hash: a byte of its content (sequence,
    /// subject, headers, payload, times, `prev_hash`) or of its hash was changed.
    Edited {
        /// The hash recomputed from the stored content.
        expected: Hash,
        /// The stored hash.
        found: Hash,
    },
    /// The record's predecessor is not in the archive: records before it were deleted.
    Dropped {
        /// The sequence of the record the walk saw just before, if any.
        previous_seq: Option<u64>,
        /// The hash it should have been chained to (the previous record's; [`GENESIS`] first).
        expected: Hash,
        /// The `prev_hash` it holds.
        found: Hash,
    },
    /// The record is out of place: its predecessor is in the archive, but somewhere else.
    Reordered {
        /// The record it was chained after.
        predecessor: RecordRef,
        /// The hash it should have been chained to (the previous record's).
        expected: Hash,
        /// The `prev_hash` it holds (its predecessor's hash).
        found: Hash,
    },
    /// The chain is intact here, but the sequence does not follow the previous record's: the
    /// chain was built without the messages in between (or with one twice), which the
    /// archiver never does — it was forged or built by something else.
    OutOfSequence {
        /// The previous record's sequence.
        previous_seq: u64,
    },
    /// The record is intact and in its place in the chain, but its position number was changed.
    Renumbered {
        /// The position it should have (one more than the previous record's; 1 for the first).
        expected: u64,
    },
    /// A column holds a value of the wrong kind (NULL, a number where bytes belong, a hash
    /// that is not 32 bytes).
    Malformed {
        /// The column.
        column: &'static str,
        /// What it holds.
        found: String,
    },
    /// The archive holds fewer records than the auditor was told: its tail was cut.
    Truncated {
        /// Records expected (at least).
        expected: u64,
        /// Records found.
        found: u64,
    },
    /// The pinned head is not where the auditor was told: the archive was truncated or
    /// rewritten.
    HeadNotFound {
        /// The pinned head.
        expected: Hash,
        /// The hash at the expected position (with [`Expect::count`]), else the archive's head.
        found: Hash,
    },
    /// SQLite could not read the archive (not an archive, or the file is damaged).
    Unreadable(String),
}

/// Renders a hash as lowercase hex.
pub fn hex(hash: &[u8]) -> String {
    use fmt::Write as _;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Parses 64 hex digits into a hash.
pub fn parse_hash(text: &str) -> Option<Hash> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = GENESIS;
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl fmt::Display for RecordRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seq {} (position {}, subject {})",
            self.seq, self.position, self.subject
        )
    }
}

impl fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.record {
            Some(r) => write!(f, "record {r}: ")?,
            None => write!(f, "archive: ")?,
        }
        match &self.fault {
            Fault::Edited { expected, found } => write!(
                f,
                "edited: its content does not match its hash\n  expected {} (recomputed from the stored content)\n  found    {} (stored)",
                hex(expected),
                hex(found)
            ),
            Fault::Dropped {
                previous_seq,
                expected,
                found,
            } => {
                let what = match (previous_seq, &self.record) {
                    (Some(p), Some(r)) if r.seq == p + 2 => format!("seq {} missing", p + 1),
                    (Some(p), Some(r)) if r.seq > p + 2 => {
                        format!("seq {}..={} missing", p + 1, r.seq - 1)
                    }
                    (Some(p), _) => format!("the record chained after seq {p} is missing"),
                    (None, _) => "the records before it are missing".to_owned(),
                };
                write!(
                    f,
                    "dropped: {what}; its predecessor is not in the archive\n  expected prev_hash {} (the previous record's hash)\n  found    prev_hash {}",
                    hex(expected),
                    hex(found)
                )
            }
            Fault::Reordered {
                predecessor,
                expected,
                found,
            } => write!(
                f,
                "reordered: it was chained after {predecessor}, which is stored {}\n  expected prev_hash {} (the previous record's hash)\n  found    prev_hash {} (the hash of seq {})",
                if predecessor.position > self.record.as_ref().map_or(0, |r| r.position) {
                    "after it"
                } else {
                    "elsewhere before it"
                },
                hex(expected),
                hex(found),
                predecessor.seq
            ),
            Fault::OutOfSequence { previous_seq } => {
                let seq = self.record.as_ref().map_or(0, |r| r.seq);
                if seq > previous_seq + 1 {
                    write!(
                        f,
                        "dropped: seq {}..={} are not in the chain, which was built without them",
                        previous_seq + 1,
                        seq - 1
                    )
                } else {
                    write!(
                        f,
                        "reordered: the sequence goes from {previous_seq} to {seq} in an intact chain"
                    )
                }
            }
            Fault::Renumbered { expected } => write!(
                f,
                "renumbered: it is intact and in chain order, but its position should be {expected}"
            ),
            Fault::Malformed { column, found } => {
                write!(f, "malformed: column {column} holds {found}")
            }
            Fault::Truncated { expected, found } => write!(
                f,
                "truncated: {found} records, expected at least {expected}; this is the last one left"
            ),
            Fault::HeadNotFound { expected, found } => write!(
                f,
                "the pinned head is not in the chain (truncated or rewritten)\n  expected {}\n  found    {}",
                hex(expected),
                hex(found)
            ),
            Fault::Unreadable(e) => write!(f, "unreadable: {e}"),
        }
    }
}

impl std::error::Error for ChainBreak {}

/// Walks the whole chain; see [`verify_against`].
#[allow(
    clippy::result_large_err,
    reason = "returned at most once per walk of the whole archive; a box would only make matching on it clumsier"
)]
pub fn verify(conn: &Connection) -> Result<Summary, ChainBreak> {
    verify_against(conn, &Expect::default())
}

/// Walks the chain in `position` order and returns its summary, or the first bad record.
///
/// For each record, in this order:
/// 1. its hash is recomputed from its stored content and `prev_hash`; a mismatch means the
///    record itself was changed ([`Fault::Edited`]) — whichever byte of it was edited,
///    `prev_hash` and `hash` included, the blame lands here and not on a neighbour;
/// 2. its `prev_hash` must be the previous record's hash ([`GENESIS`] for the first); if not,
///    the record that hash belongs to is looked up: found elsewhere, the record is out of place
///    ([`Fault::Reordered`]); found nowhere, its predecessor was deleted ([`Fault::Dropped`]);
/// 3. its position must follow the previous record's (1 for the first): positions are not
///    hashed (the chain fixes the order), but a changed one is still a changed byte
///    ([`Fault::Renumbered`]).
///
/// A cut tail leaves a valid chain; only [`Expect`] (a head or count the auditor was given
/// earlier) detects it.
#[allow(
    clippy::result_large_err,
    reason = "returned at most once per walk of the whole archive; a box would only make matching on it clumsier"
)]
pub fn verify_against(conn: &Connection, expect: &Expect) -> Result<Summary, ChainBreak> {
    let unreadable = |e: rusqlite::Error| ChainBreak {
        record: None,
        fault: Fault::Unreadable(e.to_string()),
    };
    let mut stmt = conn
        .prepare(
            "SELECT position, seq, subject, headers, payload, published_ns, archived_ns,
                    prev_hash, hash
             FROM records ORDER BY position",
        )
        .map_err(unreadable)?;
    let mut rows = stmt.query([]).map_err(unreadable)?;
    let mut previous: Option<(u64, u64, Hash)> = None; // position, seq, hash
    let mut summary = Summary {
        records: 0,
        first_seq: None,
        last_seq: None,
        head: GENESIS,
        pinned: None,
    };
    while let Some(row) = rows.next().map_err(unreadable)? {
        // Named only when something is wrong: the happy path allocates nothing per record.
        let broken = |fault| ChainBreak {
            record: Some(read_ref(row)),
            fault,
        };
        let position = int(row, 0, "position").map_err(broken)? as u64;
        let seq = int(row, 1, "seq").map_err(broken)? as u64;
        let subject = bytes(row, 2, "subject").map_err(broken)?;
        let headers = bytes(row, 3, "headers").map_err(broken)?;
        let payload = bytes(row, 4, "payload").map_err(broken)?;
        let published_ns = int(row, 5, "published_ns").map_err(broken)?;
        let archived_ns = int(row, 6, "archived_ns").map_err(broken)?;
        let prev_hash = hash(row, 7, "prev_hash").map_err(broken)?;
        let stored = hash(row, 8, "hash").map_err(broken)?;

        let computed = record_hash(
            &prev_hash,
            seq,
            published_ns,
            archived_ns,
            subject,
            headers,
            payload,
        );
        if computed != stored {
            return Err(broken(Fault::Edited {
                expected: computed,
                found: stored,
            }));
        }
        let expected_prev = previous.map_or(GENESIS, |(_, _, h)| h);
        if prev_hash != expected_prev {
            let fault = match find_by_hash(conn, &prev_hash).map_err(unreadable)? {
                Some(predecessor) => Fault::Reordered {
                    predecessor,
                    expected: expected_prev,
                    found: prev_hash,
                },
                None => Fault::Dropped {
                    previous_seq: previous.map(|(_, s, _)| s),
                    expected: expected_prev,
                    found: prev_hash,
                },
            };
            return Err(broken(fault));
        }
        if let Some((_, previous_seq, _)) = previous.filter(|(_, s, _)| seq != s + 1) {
            return Err(broken(Fault::OutOfSequence { previous_seq }));
        }
        let expected_position = previous.map_or(1, |(p, _, _)| p + 1);
        if position != expected_position {
            return Err(broken(Fault::Renumbered {
                expected: expected_position,
            }));
        }

        summary.records += 1;
        summary.first_seq.get_or_insert(seq);
        summary.last_seq = Some(seq);
        summary.head = stored;
        if let Some(pin) = expect.head.filter(|_| summary.pinned.is_none()) {
            // With a count, the pinned head must be exactly that record; without, any record.
            let here = expect.count.is_none_or(|n| n == summary.records);
            if here && stored == pin {
                summary.pinned = Some((summary.records, seq));
            } else if here && expect.count.is_some() {
                return Err(broken(Fault::HeadNotFound {
                    expected: pin,
                    found: stored,
                }));
            }
        }
        previous = Some((position, seq, stored));
    }
    let last = || match previous {
        Some((position, seq, _)) => find_by_position(conn, position, seq),
        None => None,
    };
    if let Some(n) = expect.count.filter(|n| summary.records < *n) {
        return Err(ChainBreak {
            record: last(),
            fault: Fault::Truncated {
                expected: n,
                found: summary.records,
            },
        });
    }
    if let (Some(pinned), None) = (expect.head, summary.pinned) {
        return Err(ChainBreak {
            record: last(),
            fault: Fault::HeadNotFound {
                expected: pinned,
                found: summary.head,
            },
        });
    }
    Ok(summary)
}

/// Names a row from whatever it holds, before anything about it is trusted.
fn read_ref(row: &rusqlite::Row<'_>) -> RecordRef {
    let int = |i| match row.get_ref(i) {
        Ok(ValueRef::Integer(v)) => v as u64,
        _ => 0,
    };
    let subject = match row.get_ref(2) {
        Ok(ValueRef::Text(b) | ValueRef::Blob(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    RecordRef {
        position: int(0),
        seq: int(1),
        subject,
    }
}

fn kind(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => format!("the integer {i}"),
        ValueRef::Real(r) => format!("the real {r}"),
        ValueRef::Text(t) => format!("{} bytes of text", t.len()),
        ValueRef::Blob(b) => format!("a blob of {} bytes", b.len()),
    }
}

fn int(row: &rusqlite::Row<'_>, i: usize, column: &'static str) -> Result<i64, Fault> {
    match row.get_ref(i) {
        Ok(ValueRef::Integer(v)) => Ok(v),
        Ok(other) => Err(Fault::Malformed {
            column,
            found: kind(other),
        }),
        Err(e) => Err(Fault::Unreadable(e.to_string())),
    }
}

/// Text and blobs alike: the hash covers the bytes, whichever way SQLite typed them.
fn bytes<'r>(
    row: &'r rusqlite::Row<'_>,
    i: usize,
    column: &'static str,
) -> Result<&'r [u8], Fault> {
    match row.get_ref(i) {
        Ok(ValueRef::Text(b) | ValueRef::Blob(b)) => Ok(b),
        Ok(other) => Err(Fault::Malformed {
            column,
            found: kind(other),
        }),
        Err(e) => Err(Fault::Unreadable(e.to_string())),
    }
}

fn hash(row: &rusqlite::Row<'_>, i: usize, column: &'static str) -> Result<Hash, Fault> {
    let b = bytes(row, i, column)?;
    b.try_into().map_err(|_| Fault::Malformed {
        column,
        found: format!("{} bytes, not 32", b.len()),
    })
}

fn find_by_hash(conn: &Connection, hash: &Hash) -> Result<Option<RecordRef>, rusqlite::Error> {
    conn.query_row(
        "SELECT position, seq, subject FROM records WHERE hash = ?1 ORDER BY position LIMIT 1",
        [&hash[..]],
        |row| Ok(read_ref(row)),
    )
    .optional()
}

fn find_by_position(conn: &Connection, position: u64, seq: u64) -> Option<RecordRef> {
    conn.query_row(
        "SELECT position, seq, subject FROM records WHERE position = ?1",
        [position as i64],
        |row| Ok(read_ref(row)),
    )
    .ok()
    .or(Some(RecordRef {
        position,
        seq,
        subject: String::new(),
    }))
}
