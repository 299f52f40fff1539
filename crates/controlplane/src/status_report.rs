//! Status as users see it: the objects Gatehouse is responsible for with its status filled in,
//! like `kubectl get -o yaml` (the admin endpoint's `/status` and `gatehouse status`).

use gatehouse_translate::kinds::{Kind, KindVisitor, StatusShape, for_each_kind};
use gatehouse_translate::{Input, ObjectKey, Status};
use serde_json::{Value, json};

/// Every object with a status of Gatehouse's, in registry order, then by namespace/name.
pub fn objects(input: &Input, status: &Status) -> Vec<Value> {
    struct Collect<'a> {
        input: &'a Input,
        status: &'a Status,
        out: Vec<Value>,
    }
    impl KindVisitor for Collect<'_> {
        fn visit<K: Kind>(&mut self) {
            let mut objects: Vec<&K> = K::of(self.input).iter().map(|o| &**o).collect();
            objects.sort_by_key(|o| ObjectKey::of(o.meta()));
            for object in objects {
                let Some(ours) = object.computed_status(self.status) else {
                    continue;
                };
                let mut o = object.clone();
                o.meta_mut().managed_fields = None;
                let mut value = serde_json::to_value(o).unwrap_or_default();
                value["status"] = match K::STATUS {
                    StatusShape::Shared(field) => json!({ field: ours }),
                    StatusShape::Whole | StatusShape::None => ours,
                };
                self.out.push(value);
            }
        }
    }
    let mut collect = Collect {
        input,
        status,
        out: Vec::new(),
    };
    for_each_kind(&mut collect);
    collect.out
}

/// Multi-document YAML of [`objects`].
pub fn to_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}
