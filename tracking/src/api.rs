//! The tracking API's words: the types of message it takes, the endpoints they are posted to, and
//! where in a request a problem is.

use std::fmt;

/// The kinds of message the tracking API takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Track,
    Identify,
    Page,
    Screen,
    Group,
    Alias,
}

impl EventType {
    pub const ALL: [EventType; 6] = [
        Self::Track,
        Self::Identify,
        Self::Page,
        Self::Screen,
        Self::Group,
        Self::Alias,
    ];

    /// The name used in the `type` field and in the endpoint's path.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Track => "track",
            Self::Identify => "identify",
            Self::Page => "page",
            Self::Screen => "screen",
            Self::Group => "group",
            Self::Alias => "alias",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// The endpoint a request was posted to: `/v1/<type>` for one message, `/v1/batch` for many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Single(EventType),
    Batch,
}

impl Endpoint {
    /// The endpoint for the last path segment: `track`, ..., `batch`, the one-letter names
    /// Segment's browser library (`t`, `i`, `p`, `s`, `g`, `a`: the type's first letter) and its
    /// batching mode and the mobile libraries (`b`) post to, or `import`, the batch endpoint's
    /// older name, which the Java, Ruby and .NET libraries post to.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "batch" | "b" | "import" => Some(Self::Batch),
            "t" => Some(Self::Single(EventType::Track)),
            "i" => Some(Self::Single(EventType::Identify)),
            "p" => Some(Self::Single(EventType::Page)),
            "s" => Some(Self::Single(EventType::Screen)),
            "g" => Some(Self::Single(EventType::Group)),
            "a" => Some(Self::Single(EventType::Alias)),
            _ => EventType::parse(name).map(Self::Single),
        }
    }

    /// The endpoint's name, as used in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single(t) => t.as_str(),
            Self::Batch => "batch",
        }
    }
}

/// Where in a request a problem is: the single message, or one item of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location(pub Option<usize>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(i) => write!(f, "batch[{i}]"),
            None => f.write_str("the message"),
        }
    }
}
