//! The streaming summariser's tests, with a counting allocator to
//! assert what a walk holds.

use super::*;

fn resource(module: Option<&str>, mode: &str, kind: &str, name: &str, instances: usize) -> String {
    let module = module.map_or(String::new(), |m| format!(r#""module":"{m}","#));
    let instances: Vec<String> = (0..instances)
        .map(|i| format!(r#"{{"index_key":{i},"attributes":{{"id":"{i}","nested":{{"a":[1,2,{{"b":null}}]}}}}}}"#))
        .collect();
    format!(
        r#"{{{module}"mode":"{mode}","type":"{kind}","name":"{name}","provider":"provider[\"registry.terraform.io/hashicorp/{kind}\"]","instances":[{}]}}"#,
        instances.join(",")
    )
}

fn state(resources: &[String], outputs: &str) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":7,"lineage":"lin","outputs":{{{outputs}}},"resources":[{}],"check_results":null}}"#,
        resources.join(",")
    )
    .into_bytes()
}

#[test]
fn groups_resources_by_module_and_type_and_counts_instances() {
    let bytes = state(
        &[
            resource(None, "managed", "aws_s3_bucket", "logs", 1),
            resource(None, "managed", "aws_s3_bucket", "data", 3),
            resource(Some("module.net"), "managed", "aws_subnet", "a", 2),
            resource(Some("module.net"), "data", "http", "c", 1),
        ],
        r#""url":{"value":"https://x","type":"string"}"#,
    );
    let view = summarise(&bytes, 1).unwrap();
    assert_eq!(view.head.serial, Some(7));
    assert_eq!(view.head.lineage.as_deref(), Some("lin"));
    assert_eq!(view.head.terraform_version.as_deref(), Some("1.11.4"));
    assert!(!view.head.encrypted);
    assert_eq!((view.resources_total, view.instances_total), (4, 7));
    let groups: Vec<(&str, &str, usize, usize)> = view
        .groups
        .iter()
        .map(|g| (g.module.as_str(), g.kind.as_str(), g.resources, g.instances))
        .collect();
    assert_eq!(
        groups,
        vec![
            ("", "aws_s3_bucket", 2, 4),
            ("module.net", "aws_subnet", 1, 2),
            ("module.net", "data.http", 1, 1),
        ]
    );
    let addresses: Vec<&str> = view.resources.iter().map(|r| r.address.as_str()).collect();
    assert_eq!(
        addresses,
        [
            "aws_s3_bucket.logs",
            "aws_s3_bucket.data",
            "module.net.aws_subnet.a",
            "module.net.data.http.c"
        ]
    );
    assert_eq!(view.resources[1].instances, 3);
    assert!(
        view.resources[0]
            .provider
            .contains("hashicorp/aws_s3_bucket")
    );
    assert_eq!(view.outputs[0].value.as_deref(), Some(r#""https://x""#));
}

#[test]
fn sensitive_outputs_are_never_kept() {
    // `sensitive` after `value`, as Terraform writes it.
    let bytes = state(
        &[],
        r#""db_password":{"value":"hunter2-secret","type":"string","sensitive":true},"plain":{"value":["a"],"type":["list","string"]}"#,
    );
    let view = summarise(&bytes, 1).unwrap();
    assert_eq!(view.outputs_total, 2);
    assert!(view.outputs[0].sensitive && view.outputs[0].value.is_none());
    assert_eq!(
        view.outputs[1].kind.as_deref(),
        Some(r#"["list","string"]"#)
    );
    let json = serde_json::to_string(&view).unwrap();
    assert!(!json.contains("hunter2"), "{json}");
}

#[test]
fn pages_hold_only_their_resources() {
    let all: Vec<String> = (0..250)
        .map(|i| resource(None, "managed", "terraform_data", &format!("r{i:03}"), 1))
        .collect();
    let bytes = state(&all, "");
    let second = summarise(&bytes, 2).unwrap();
    assert_eq!(
        (second.page, second.pages, second.resources_total),
        (2, 3, 250)
    );
    assert_eq!(second.resources.len(), RESOURCES_PER_PAGE);
    assert_eq!(second.resources[0].address, "terraform_data.r100");
    let last = summarise(&bytes, 99).unwrap();
    assert_eq!((last.page, last.resources.len()), (3, 50));
    assert_eq!(last.resources[49].address, "terraform_data.r249");
}

#[test]
fn long_output_values_are_cut() {
    let long = "é".repeat(OUTPUT_SHOWN_BYTES);
    let bytes = state(
        &[],
        &format!(r#""long":{{"value":"{long}","type":"string"}}"#),
    );
    let view = summarise(&bytes, 1).unwrap();
    let value = view.outputs[0].value.as_deref().unwrap();
    assert!(
        view.outputs[0].cut && value.len() <= OUTPUT_SHOWN_BYTES,
        "{}",
        value.len()
    );
}

#[test]
fn opentofu_envelopes_are_encrypted_not_errors() {
    let tofu = br#"{"serial":3,"lineage":"l","meta":{"key_provider.pbkdf2.k":"e30="},"encrypted_data":"AAAA","encryption_version":"v0"}"#;
    let view = summarise(tofu, 1).unwrap();
    assert!(view.head.encrypted);
    assert_eq!((view.head.serial, view.resources_total), (Some(3), 0));
    assert!(find(tofu, "x").unwrap().encrypted);
}

#[test]
fn what_is_not_a_state_says_so_in_one_line() {
    for bad in [
        &b"[1,2]"[..],
        b"{\"version\":4",
        b"{\"serial\":1}",
        b"{\"version\":3}",
    ] {
        let err = summarise(bad, 1).unwrap_err();
        assert!(!err.contains('\n') && !err.is_empty(), "{err}");
    }
    // The offending value is never quoted (it may be a secret).
    let err = summarise(
        br#"{"version":4,"outputs":{"o":{"value":1,"sensitive":"hunter2"}}}"#,
        1,
    )
    .unwrap_err();
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn search_finds_addresses_and_types() {
    let bytes = state(
        &[
            resource(None, "managed", "aws_s3_bucket", "logs", 1),
            resource(Some("module.a"), "managed", "aws_s3_bucket", "logs", 1),
            resource(None, "managed", "aws_s3_bucket", "other_logs", 1),
            resource(None, "data", "aws_s3_bucket", "logs", 1),
        ],
        "",
    );
    let by_address = find(&bytes, "aws_s3_bucket.logs").unwrap();
    assert_eq!(
        by_address.addresses,
        ["aws_s3_bucket.logs", "module.a.aws_s3_bucket.logs"]
    );
    assert_eq!(find(&bytes, "aws_s3_bucket.logs[0]").unwrap().matched, 2);
    assert_eq!(find(&bytes, "aws_s3_bucket").unwrap().matched, 3);
    assert_eq!(
        find(&bytes, "data.aws_s3_bucket").unwrap().addresses,
        ["data.aws_s3_bucket.logs"]
    );
    assert_eq!(find(&bytes, "logs").unwrap().matched, 0);
    assert_eq!(
        find(&bytes, "module.a.aws_s3_bucket.logs").unwrap().matched,
        1
    );
}

/// The walk holds a page, not the state: summarising a 100 MiB state
/// of 200 000 resources allocates a small fraction of its size (the
/// tree `serde_json::Value` would build is several times the size).
#[test]
fn a_big_state_costs_a_page_not_a_tree() {
    let one = resource(Some("module.m"), "managed", "terraform_data", "r", 4);
    let copies = (100usize << 20) / one.len();
    let all: Vec<String> = (0..copies).map(|_| one.clone()).collect();
    let bytes = state(&all, r#""big":{"value":"x","type":"string"}"#);
    drop(all);
    let start = allocated::start();
    let view = summarise(&bytes, 3).unwrap();
    let peak = allocated::peak_since(start);
    assert_eq!(view.resources_total, copies);
    assert_eq!(view.resources.len(), RESOURCES_PER_PAGE);
    println!(
        "summarising {} MiB held {} KiB at its peak",
        bytes.len() >> 20,
        peak >> 10
    );
    assert!(
        peak < 1 << 20,
        "summarising {} MiB held {} KiB at its peak",
        bytes.len() >> 20,
        peak >> 10
    );
}

/// The test build's counting allocator: how much this thread's heap use
/// grew at its peak, to assert what a walk holds. Counted per thread (the
/// walk allocates and frees on its own), so tests running beside it do
/// not count.
#[allow(unsafe_code)] // A GlobalAlloc is unsafe by definition; test builds only.
mod allocated {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static NOW: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    struct Counting;

    fn count(delta: isize) {
        // Threads being torn down have no counters left: not counted.
        let _ = NOW.try_with(|now| {
            now.set(now.get() + delta);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now.get())));
        });
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size() as isize);
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(layout.size() as isize));
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size as isize - layout.size() as isize);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// This thread's heap use now; its peak is reset to it.
    pub fn start() -> isize {
        let now = NOW.with(Cell::get);
        PEAK.with(|peak| peak.set(now));
        now
    }

    /// Bytes this thread's heap use rose above `start` at its peak.
    pub fn peak_since(start: isize) -> usize {
        (PEAK.with(Cell::get) - start).max(0) as usize
    }
}
