use super::*;

#[test]
fn formats_timestamps() {
    assert_eq!(format_ms(0), "1970-01-01 00:00:00.000Z");
    assert_eq!(format_ms(1_795_386_697_123), "2026-11-22 22:31:37.123Z");
    assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00.000Z");
}

#[test]
fn human_durations() {
    assert_eq!(human_duration(5), "5 ms");
    assert_eq!(human_duration(1500), "1.5 s");
    assert_eq!(human_duration(125_000), "2 min 5 s");
}

#[test]
fn a_preview_is_one_line_and_cut_on_a_character() {
    assert_eq!(preview("{\"a\":1}", 80), "{\"a\":1}");
    assert_eq!(preview("line one\nline two", 80), "line one line two");
    let long = "é".repeat(100);
    assert_eq!(preview(&long, 80), format!("{}…", "é".repeat(80)));
}
