//! Parsing a cron expression and time zone, and computing occurrences (DST
//! included).

use super::{Cron, CronParser, DateTime, FromStr, Seconds, TimeZone, Tz, Year};

/// A schedule's expression and time zone, parsed: computes its occurrences.
#[derive(Debug, Clone)]
pub struct Timing {
    cron: Cron,
    tz: Tz,
}

/// Parses a 5- or 6-field cron expression (croner's extensions included).
pub(super) fn parse_expression(expr: &str) -> Result<Cron, String> {
    let parser = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build();
    parser.parse(expr).map_err(|e| e.to_string())
}

impl Timing {
    /// Parses both parts; the message says which one is wrong and why.
    pub fn parse(expression: &str, timezone: &str) -> Result<Timing, String> {
        let (e, z) = (&crate::validate::EXPRESSION_LEN, &crate::validate::TIMEZONE_LEN);
        if !e.contains(&expression.chars().count()) {
            return Err(format!(
                "`expression` must be {} to {} characters, for example \"*/5 * * * *\"",
                e.start(),
                e.end()
            ));
        }
        if !z.contains(&timezone.chars().count()) {
            return Err(format!(
                "`timezone` must be {} to {} characters: an IANA time zone name such as \"UTC\"",
                z.start(),
                z.end()
            ));
        }
        let cron = parse_expression(expression).map_err(|e| {
            format!(
                "`expression` {} is not a valid cron expression ({e}); use 5 fields \
                 (minute hour day-of-month month day-of-week) or 6 with seconds first, \
                 for example \"*/5 * * * *\"",
                crate::validate::shorten(expression)
            )
        })?;
        let tz = Tz::from_str(timezone).map_err(|_| {
            format!(
                "`timezone` {} is not an IANA time zone name; use a name such as \"UTC\", \
                 \"Europe/Berlin\" or \"America/New_York\"",
                crate::validate::shorten(timezone)
            )
        })?;
        Ok(Timing { cron, tz })
    }

    pub fn tz(&self) -> Tz {
        self.tz
    }

    fn at(&self, ms: i64) -> Option<DateTime<Tz>> {
        self.tz.timestamp_millis_opt(ms).single()
    }

    /// The occurrences strictly after `after_ms`, ascending, that are at most
    /// `until_ms`, no more than `max` of them; and the occurrence that follows
    /// the last one returned (or follows `after_ms` when none is), if any.
    /// Times are Unix ms; each is an exact instant, so a wall-clock time that a
    /// DST change repeats yields both instants when the expression matches it
    /// on both passes (croner's rules: fixed-time jobs once, intervals twice).
    pub fn occurrences(&self, after_ms: i64, until_ms: i64, max: usize) -> (Vec<i64>, Option<i64>) {
        let mut out = Vec::new();
        let Some(start) = self.at(after_ms) else {
            return (out, None);
        };
        for dt in self.cron.iter_after(start) {
            let ms = dt.timestamp_millis();
            if ms > until_ms || out.len() >= max {
                return (out, Some(ms));
            }
            out.push(ms);
        }
        (out, None)
    }

    /// The next `n` occurrences after `after_ms`.
    pub fn next(&self, after_ms: i64, n: usize) -> Vec<i64> {
        let (v, _) = self.occurrences(after_ms, i64::MAX, n);
        v
    }

    /// The expression in words, e.g. "Every 5 minutes." (croner's English,
    /// minus its "At every ...").
    pub fn describe(&self) -> String {
        let words = self.cron.describe();
        match words.strip_prefix("At every ") {
            Some(rest) => format!("Every {rest}"),
            None => words,
        }
    }

    /// A Unix ms time as a wall-clock time in the schedule's zone, with the
    /// zone's abbreviation: `2025-03-30 03:00:00 CEST`.
    pub fn local(&self, ms: i64) -> String {
        match self.at(ms) {
            Some(dt) => dt.format("%Y-%m-%d %H:%M:%S %Z").to_string(),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Datelike, Utc};

    use super::*;
    use crate::config::TasksConfig;
    use crate::schedules::{Overlap, ScheduleDef, check};
    use muster_api::TaskTemplate;

    fn ms(tz: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    fn utc_ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap().timestamp_millis()
    }

    fn berlin(expr: &str) -> Timing {
        Timing::parse(expr, "Europe/Berlin").unwrap()
    }

    /// Occurrences within one Berlin calendar day, as UTC ms.
    fn day(t: &Timing, y: i32, mo: u32, d: u32) -> Vec<i64> {
        let tz = t.tz();
        let start = ms(tz, y, mo, d, 0, 0) - 1;
        let next = chrono::NaiveDate::from_ymd_opt(y, mo, d).unwrap().succ_opt().unwrap();
        let end = ms(tz, next.year(), next.month(), next.day(), 0, 0) - 1;
        t.occurrences(start, end, 1000).0
    }

    #[test]
    fn berlin_spring_forward_day() {
        // 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00 UTC). The day has 23 hours.
        let hourly = berlin("0 * * * *");
        let got = day(&hourly, 2025, 3, 30);
        assert_eq!(got.len(), 23, "an hourly schedule fires 23 times");
        assert_eq!(got[0], utc_ms(2025, 3, 29, 23, 0));
        assert_eq!(got[1], utc_ms(2025, 3, 30, 0, 0), "01:00 CET");
        assert_eq!(got[2], utc_ms(2025, 3, 30, 1, 0), "03:00 CEST follows 01:00 CET");
        // A fixed time inside the gap runs once, right after the gap (03:00 CEST).
        let at_230 = berlin("30 2 * * *");
        assert_eq!(day(&at_230, 2025, 3, 30), vec![utc_ms(2025, 3, 30, 1, 0)]);
        // The days around it are ordinary.
        assert_eq!(day(&at_230, 2025, 3, 29), vec![utc_ms(2025, 3, 29, 1, 30)]);
        assert_eq!(day(&at_230, 2025, 3, 31), vec![utc_ms(2025, 3, 31, 0, 30)]);
        // An interval skips the hour that does not exist.
        let halfhourly = berlin("*/30 1-3 * * *");
        assert_eq!(
            day(&halfhourly, 2025, 3, 30),
            vec![
                utc_ms(2025, 3, 30, 0, 0),
                utc_ms(2025, 3, 30, 0, 30),
                utc_ms(2025, 3, 30, 1, 0),
                utc_ms(2025, 3, 30, 1, 30)
            ]
        );
        assert_eq!(hourly.local(got[2]), "2025-03-30 03:00:00 CEST");
    }

    #[test]
    fn berlin_fall_back_day() {
        // 2025-10-26: 03:00 CEST goes back to 02:00 CET (01:00 UTC). The day has 25 hours.
        let hourly = berlin("0 * * * *");
        let got = day(&hourly, 2025, 10, 26);
        assert_eq!(got.len(), 25, "an hourly schedule fires 25 times");
        assert_eq!(got[2], utc_ms(2025, 10, 26, 0, 0), "02:00 CEST");
        assert_eq!(got[3], utc_ms(2025, 10, 26, 1, 0), "02:00 CET, the repeated hour");
        assert_eq!(got[4], utc_ms(2025, 10, 26, 2, 0), "03:00 CET");
        // A fixed time in the repeated hour runs once, on its first pass.
        let at_230 = berlin("30 2 * * *");
        assert_eq!(day(&at_230, 2025, 10, 26), vec![utc_ms(2025, 10, 26, 0, 30)]);
        assert_eq!(day(&at_230, 2025, 10, 27), vec![utc_ms(2025, 10, 27, 1, 30)]);
        // An interval runs on both passes.
        let quarter = berlin("*/30 2 * * *");
        assert_eq!(
            day(&quarter, 2025, 10, 26),
            vec![
                utc_ms(2025, 10, 26, 0, 0),
                utc_ms(2025, 10, 26, 0, 30),
                utc_ms(2025, 10, 26, 1, 0),
                utc_ms(2025, 10, 26, 1, 30)
            ]
        );
        assert_eq!(hourly.local(got[2]), "2025-10-26 02:00:00 CEST");
        assert_eq!(hourly.local(got[3]), "2025-10-26 02:00:00 CET");
    }

    #[test]
    fn resuming_from_an_occurrence_in_the_repeated_hour_keeps_its_pass() {
        // The scheduler resumes from its cursor, an exact instant: from the
        // first 02:30 the next is the second 02:00 pass, not a repeat.
        let every_30 = berlin("*/30 * * * *");
        let first_0230 = utc_ms(2025, 10, 26, 0, 30);
        let (next, _) = every_30.occurrences(first_0230, i64::MAX, 3);
        assert_eq!(
            next,
            vec![
                utc_ms(2025, 10, 26, 1, 0),
                utc_ms(2025, 10, 26, 1, 30),
                utc_ms(2025, 10, 26, 2, 0)
            ]
        );
    }

    #[test]
    fn occurrences_report_the_successor() {
        let t = Timing::parse("* * * * * *", "UTC").unwrap();
        let base = utc_ms(2030, 1, 1, 0, 0);
        let (v, after) = t.occurrences(base, base + 3000, 10);
        assert_eq!(v, vec![base + 1000, base + 2000, base + 3000]);
        assert_eq!(after, Some(base + 4000));
        let (v, after) = t.occurrences(base + 500, base + 10_000, 2);
        assert_eq!(v, vec![base + 1000, base + 2000], "cut at max");
        assert_eq!(after, Some(base + 3000));
    }

    #[test]
    fn five_and_six_fields() {
        let five = Timing::parse("*/5 * * * *", "UTC").unwrap();
        let base = utc_ms(2030, 1, 1, 0, 0);
        assert_eq!(five.next(base, 2), vec![base + 300_000, base + 600_000]);
        let six = Timing::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(six.next(base, 2), vec![base + 10_000, base + 20_000]);
        assert!(Timing::parse("* * * * * * *", "UTC").is_err(), "no year field");
        assert!(Timing::parse("* * * *", "UTC").is_err());
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = Timing::parse("61 * * * *", "UTC").unwrap_err();
        assert!(e.contains("`expression`") && e.contains("61"), "{e}");
        let e = Timing::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(e.contains("`timezone`") && e.contains("Mars/Olympus"), "{e}");
        let def = ScheduleDef {
            id: "x".into(),
            expression: "0 0 30 2 *".into(),
            timezone: "UTC".into(),
            queue: "q".into(),
            task: TaskTemplate::default(),
            enabled: true,
            overlap: Overlap::Allow,
            starting_deadline_ms: None,
            backfill: false,
        };
        let e = check(
            &def,
            &TasksConfig::default(),
            &crate::store::shards::ShardMap::new("muster", 1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("never matches"), "{e}");
    }

    #[test]
    fn describes_in_words() {
        let t = Timing::parse("*/5 * * * *", "UTC").unwrap();
        assert!(
            t.describe().to_lowercase().contains("every 5 minutes"),
            "{}",
            t.describe()
        );
    }
}
