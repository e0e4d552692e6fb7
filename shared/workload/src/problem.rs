//! One thing wrong with a spec, said so its author can find and fix it.

use std::fmt;

/// What kind of problem it is (for tools and tests; the message says the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemKind {
    /// Not YAML or JSON at all.
    Syntax,
    /// A field the spec does not have.
    UnknownField,
    /// A field of the wrong type, a missing field, a wrong `apiVersion` or `kind`.
    Structure,
    /// A quantity or duration that does not parse, or fields that exclude each other.
    Resources,
    /// A name that cannot be used (not a subject token, too long, empty command).
    Name,
    /// Two tasks with one name.
    DuplicateTask,
    /// `after` names a task that does not exist.
    UnknownDependency,
    /// Tasks that wait for each other.
    Cycle,
    /// A gang whose members cannot start together.
    Gang,
    /// A team the teams file does not list.
    UnknownTeam,
    /// A priority class the configuration does not define.
    UnknownPriorityClass,
    /// A request no node of the cluster could ever hold.
    Unsatisfiable,
    /// A spec larger than [`crate::limits`] allow (bytes, tasks).
    TooLarge,
}

/// One problem in a spec: where, in which task, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The kind of problem.
    pub kind: ProblemKind,
    /// Where in the document, e.g. `spec.tasks[2].after[0]`; empty for the whole document.
    pub path: String,
    /// The name of the task the path is in, when it is in one.
    pub task: Option<String>,
    /// What is wrong, and where possible what to write instead.
    pub message: String,
    /// Line and column (1-based) in the text, where the format gives them.
    pub line_column: Option<(usize, usize)>,
}

impl SpecProblem {
    /// A problem at `path` (no task, no location).
    pub fn new(kind: ProblemKind, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            path: path.into(),
            task: None,
            message: message.into(),
            line_column: None,
        }
    }

    /// The same problem, said to be in task `name`.
    pub fn in_task(mut self, name: impl Into<String>) -> Self {
        self.task = Some(name.into());
        self
    }
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.is_empty() {
            f.write_str(&self.path)?;
            if let Some(task) = &self.task {
                write!(f, " (task {task:?})")?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&self.message)?;
        if let Some((line, column)) = self.line_column {
            write!(f, " at line {line} column {column}")?;
        }
        Ok(())
    }
}

/// `spec.tasks[2]` for index 2.
pub fn task_path(index: usize) -> String {
    format!("spec.tasks[{index}]")
}
