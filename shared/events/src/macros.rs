/// Declares one domain's event enum: a variant per event, its wire name, and the glue that maps
/// between the enum and `io.allot.<domain>.v1.<name>` types.
macro_rules! domain_events {
    (
        $(#[$meta:meta])*
        pub enum $enum:ident in $domain:literal {
            $(
                $(#[$vmeta:meta])*
                $variant:ident($payload:ty) = $name:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize)]
        #[serde(untagged)]
        pub enum $enum {
            $( $(#[$vmeta])* $variant($payload), )+
        }

        impl $enum {
            /// The domain segment of this enum's event types.
            pub const DOMAIN: &'static str = $domain;
            /// The current major version of this domain's events.
            pub const VERSION: u32 = 1;
            /// Every event name in this domain, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The event's name within its domain (`registered`, …).
            pub fn name(&self) -> &'static str {
                match self { $( Self::$variant(_) => $name, )+ }
            }

            /// The full CloudEvents type, e.g. `io.allot.node.v1.registered`.
            pub fn event_type(&self) -> String {
                format!("{}{}.v{}.{}", $crate::TYPE_PREFIX, $domain, Self::VERSION, self.name())
            }

            /// Deserializes the `data` of an event of this domain named `name` (current
            /// version), from wherever the envelope's reader is (see [`crate::envelope::decode`]).
            pub(crate) fn deserialize_data<'de, D: serde::Deserializer<'de>>(
                name: &str,
                data: D,
            ) -> Result<Self, D::Error> {
                match name {
                    $( $name => <$payload as serde::Deserialize>::deserialize(data).map(Self::$variant), )+
                    _ => Err(<D::Error as serde::de::Error>::custom("unknown event")),
                }
            }

            /// JSON Schemas of every event in this domain (envelope and payload), keyed by full type.
            pub(crate) fn data_schemas() -> Vec<(String, schemars::Schema)> {
                vec![$(
                    (
                        format!("{}{}.v{}.{}", $crate::TYPE_PREFIX, $domain, Self::VERSION, $name),
                        schemars::generate::SchemaSettings::draft2020_12()
                            .into_generator()
                            .into_root_schema_for::<$crate::Envelope<$payload>>(),
                    ),
                )+]
            }
        }

        $(
            impl From<$payload> for $enum {
                fn from(payload: $payload) -> Self { Self::$variant(payload) }
            }
            impl From<$payload> for $crate::AnyEvent {
                fn from(payload: $payload) -> Self { $crate::AnyEvent::from($enum::$variant(payload)) }
            }
        )+
    };
}
