//! Trace loaders, one per format, and the CSV plumbing they share.
//!
//! - [`philly`]: the Microsoft Philly trace as the Pollux artifact ships it, with the VC sizes of
//!   the Helios artifact, cut to a submit-time [`philly::Window`].
//! - [`openb`]: the Alibaba GPU-sharing trace (pods with GPU fractions and models, and nodes).
//! - [`tiresias`]: the Tiresias simulator's job list and cluster spec.
//! - [`generic`]: our own minimal CSV, for traces converted from anywhere else.
//!
//! Every loader reads its CSV files with headers and looks columns up by name, so column order
//! does not matter; only the columns a loader uses are required. Blank lines are skipped. The
//! first bad row stops the load with a [`LoadError`] naming the file, the 1-based line (the
//! header is line 1) and the column. Jobs are numbered in file order among those loaded and come
//! back sorted by (submit, id), so equal submit times keep file order.

pub mod generic;
pub mod openb;
pub mod philly;
pub mod tiresias;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::trace::{LoadError, Millis, TraceJob};

/// The team of jobs whose trace names none.
pub(crate) const DEFAULT_TEAM: &str = "default";

/// One CSV file with headers, read into memory so that rows can be given their true line.
#[derive(Debug)]
pub(crate) struct CsvFile {
    path: PathBuf,
    headers: csv::StringRecord,
    reader: csv::Reader<Cursor<Vec<u8>>>,
}

/// A column found in a [`CsvFile`]'s header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Column {
    index: usize,
    name: &'static str,
}

impl CsvFile {
    /// Opens `path` and reads its header (line 1).
    pub(crate) fn open(path: &Path) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path)
            .map_err(|err| load_error(path, None, None, format!("cannot read: {err}")))?;
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            // Row widths are checked in `Rows` so that the error reads like the others.
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(Cursor::new(bytes));
        let headers = reader
            .headers()
            .map_err(|err| csv_error(path, Some(1), &err))?
            .clone();
        let mut seen = HashSet::new();
        if let Some(twice) = headers.iter().find(|name| !seen.insert(*name)) {
            return Err(load_error(
                path,
                Some(1),
                Some(twice),
                "the header names this column twice",
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            headers,
            reader,
        })
    }

    /// The column named `name`; an error on line 1 when the header lacks it.
    pub(crate) fn column(&self, name: &'static str) -> Result<Column, LoadError> {
        self.optional_column(name).ok_or_else(|| {
            load_error(
                &self.path,
                Some(1),
                Some(name),
                format!(
                    "missing required column (the header has: {})",
                    self.headers.iter().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// The column named `name`, if the header has it.
    pub(crate) fn optional_column(&self, name: &'static str) -> Option<Column> {
        self.headers
            .iter()
            .position(|header| header == name)
            .map(|index| Column { index, name })
    }

    /// Fails on line 1 when the header has a column not in `known`, so that a misspelt optional
    /// column is reported rather than silently ignored.
    pub(crate) fn reject_unknown_columns(&self, known: &[&str]) -> Result<(), LoadError> {
        let unknown: Vec<&str> = self
            .headers
            .iter()
            .filter(|name| !known.contains(name))
            .collect();
        match unknown.first() {
            None => Ok(()),
            Some(first) => Err(load_error(
                &self.path,
                Some(1),
                Some(first),
                format!(
                    "unknown column{} `{}`; the known columns are: {}",
                    if unknown.len() == 1 { "" } else { "s" },
                    unknown.join("`, `"),
                    known.join(", ")
                ),
            )),
        }
    }

    /// An error about the file as a whole (no line, no column).
    pub(crate) fn error(&self, message: impl Into<String>) -> LoadError {
        load_error(&self.path, None, None, message)
    }

    /// The rows after the header, skipping blank lines.
    pub(crate) fn rows(&mut self) -> Rows<'_> {
        Rows {
            file: &self.path,
            width: self.headers.len(),
            reader: &mut self.reader,
            counted_to: 0,
            line: 1,
        }
    }
}

/// The rows of a [`CsvFile`]; see [`CsvFile::rows`].
#[derive(Debug)]
pub(crate) struct Rows<'a> {
    file: &'a Path,
    width: usize,
    reader: &'a mut csv::Reader<Cursor<Vec<u8>>>,
    /// Line breaks before this byte are counted in `line`.
    counted_to: usize,
    /// The line `counted_to` is on.
    line: u64,
}

impl Rows<'_> {
    /// The line a record starts on, given where the reader began looking for it.
    ///
    /// The csv crate's own `Position::line` is where the reader began, before it skipped blank
    /// lines (and, with CRLF, it is off by one), so it cannot name the line of a bad row.
    /// `Position::byte` is reliable: skip the line breaks the reader skipped and count the rest.
    fn line_at(&mut self, search_from: u64) -> u64 {
        let bytes = self.reader.get_ref().get_ref();
        let mut start = usize::try_from(search_from).map_or(bytes.len(), |at| at.min(bytes.len()));
        while matches!(bytes.get(start), Some(b'\n' | b'\r')) {
            start += 1;
        }
        for at in self.counted_to..start {
            // A line ends with `\n`, `\r\n` or a lone `\r`.
            let breaks = match bytes[at] {
                b'\n' => true,
                b'\r' => bytes.get(at + 1) != Some(&b'\n'),
                _ => false,
            };
            if breaks {
                self.line += 1;
            }
        }
        self.counted_to = self.counted_to.max(start);
        self.line
    }
}

impl<'a> Iterator for Rows<'a> {
    type Item = Result<Row<'a>, LoadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let mut record = csv::StringRecord::new();
            match self.reader.read_record(&mut record) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => {
                    let line = err.position().map(|position| self.line_at(position.byte()));
                    return Some(Err(csv_error(self.file, line, &err)));
                }
            }
            let line = self.line_at(record.position().map_or(0, csv::Position::byte));
            // The parser already drops empty lines; a line of blanks trims to one empty field.
            if record.len() == 1 && record[0].is_empty() {
                continue;
            }
            if record.len() != self.width {
                return Some(Err(load_error(
                    self.file,
                    Some(line),
                    None,
                    format!(
                        "{} fields where the header has {}",
                        record.len(),
                        self.width
                    ),
                )));
            }
            return Some(Ok(Row {
                file: self.file,
                line,
                record,
            }));
        }
    }
}

/// One non-blank row of a [`CsvFile`], with what it takes to name it in errors.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    file: &'a Path,
    line: u64,
    record: csv::StringRecord,
}

impl Row<'_> {
    /// `<file name>:<line>`, the name of a job whose trace gives it none.
    pub(crate) fn default_name(&self) -> String {
        let file = self.file.file_name().map_or_else(
            || self.file.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        format!("{file}:{}", self.line)
    }

    /// The field in `column`, trimmed.
    pub(crate) fn get(&self, column: Column) -> &str {
        &self.record[column.index]
    }

    /// The field in `column` if the file has that column and the field is not empty.
    pub(crate) fn get_optional(&self, column: Option<Column>) -> Option<&str> {
        column
            .map(|column| self.get(column))
            .filter(|field| !field.is_empty())
    }

    /// The field in `column`, which must not be empty.
    pub(crate) fn non_empty(&self, column: Column) -> Result<&str, LoadError> {
        match self.get(column) {
            "" => Err(self.error(column, "empty field")),
            field => Ok(field),
        }
    }

    /// Parses the field in `column`; `expected` says what it should be, for the error.
    pub(crate) fn parse<T: FromStr>(&self, column: Column, expected: &str) -> Result<T, LoadError> {
        let field = self.get(column);
        field.parse().map_err(|_| {
            self.error(
                column,
                format!("expected {expected}, found {}", shown(field)),
            )
        })
    }

    /// Parses the field in `column` if the file has that column and the field is not empty.
    pub(crate) fn parse_optional<T: FromStr>(
        &self,
        column: Option<Column>,
        expected: &str,
    ) -> Result<Option<T>, LoadError> {
        match column {
            Some(column) if !self.get(column).is_empty() => self.parse(column, expected).map(Some),
            _ => Ok(None),
        }
    }

    /// A time or duration in seconds (possibly fractional), as whole milliseconds.
    pub(crate) fn seconds(&self, column: Column) -> Result<Millis, LoadError> {
        let field = self.get(column);
        let seconds: f64 = field
            .parse()
            .map_err(|_| self.error(column, format!("expected seconds, found {}", shown(field))))?;
        millis_from_seconds(seconds).map_err(|message| self.error(column, message))
    }

    /// Like [`Row::seconds`], but an empty field is `None`.
    pub(crate) fn seconds_optional(&self, column: Column) -> Result<Option<Millis>, LoadError> {
        if self.get(column).is_empty() {
            Ok(None)
        } else {
            self.seconds(column).map(Some)
        }
    }

    /// An error about the field in `column` of this row.
    pub(crate) fn error(&self, column: Column, message: impl Into<String>) -> LoadError {
        load_error(self.file, Some(self.line), Some(column.name), message)
    }

    /// An error about this row as a whole.
    pub(crate) fn row_error(&self, message: impl Into<String>) -> LoadError {
        load_error(self.file, Some(self.line), None, message)
    }
}

/// Converts seconds to milliseconds, rounding to the nearest; negative, NaN and infinite
/// values, and values beyond `Millis`, are errors.
pub(crate) fn millis_from_seconds(seconds: f64) -> Result<Millis, String> {
    if seconds.is_nan() {
        return Err("expected seconds, found NaN".to_owned());
    }
    if seconds < 0.0 {
        return Err(format!("negative seconds ({seconds})"));
    }
    let millis = (seconds * 1000.0).round();
    // `Millis::MAX as f64` rounds up to 2^64, which itself does not fit: hence `>=`.
    if millis >= Millis::MAX as f64 {
        return Err(format!("{seconds} seconds is too large"));
    }
    Ok(millis as Millis)
}

/// The id of the next job loaded from `row`: its position among the `loaded` jobs so far.
pub(crate) fn next_job_id(loaded: usize, row: &Row<'_>) -> Result<u32, LoadError> {
    u32::try_from(loaded).map_err(|_| row.row_error("more jobs than a trace can hold (2^32)"))
}

/// Orders jobs by (submit, id): the order the simulator replays them in.
pub(crate) fn sort_jobs(jobs: &mut [TraceJob]) {
    jobs.sort_unstable_by_key(|job| (job.submit, job.id));
}

/// Splits a list of GPU models such as `V100M16|V100M32`; empty or `nan` (pandas' missing
/// value) means any model.
pub(crate) fn gpu_models(field: &str) -> Vec<String> {
    if field.is_empty() || field.eq_ignore_ascii_case("nan") {
        return Vec::new();
    }
    field
        .split('|')
        .map(str::trim)
        .filter(|model| !model.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The field as it appears in an error message.
fn shown(field: &str) -> String {
    if field.is_empty() {
        "an empty field".to_owned()
    } else {
        format!("`{field}`")
    }
}

fn load_error(
    file: &Path,
    line: Option<u64>,
    column: Option<&str>,
    message: impl Into<String>,
) -> LoadError {
    LoadError {
        file: file.to_path_buf(),
        line,
        column: column.map(str::to_owned),
        message: message.into(),
    }
}

fn csv_error(file: &Path, line: Option<u64>, err: &csv::Error) -> LoadError {
    let message = match err.kind() {
        csv::ErrorKind::Io(io) => format!("cannot read: {io}"),
        csv::ErrorKind::Utf8 { err, .. } => {
            format!("field {} is not valid UTF-8", err.field() + 1)
        }
        _ => err.to_string(),
    };
    load_error(file, line, None, message)
}
