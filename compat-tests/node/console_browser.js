// The console in a real browser (Debian's chromium, driven by
// playwright-core): the cluster page, the topics list and its search, a
// topic's partitions and ranges, and its messages. Run by
// compat-tests/python/test_console.py with the admin URL and a topic that
// holds JSON records; prints what it saw as JSON and exits non-zero on any
// failure (a page error included).
"use strict";

const { chromium } = require("playwright-core");

async function main() {
  const [base, topic, screenshot, group] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  const errors = [];
  let page = null;
  try {
    page = await browser.newPage();
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    const seen = {};

    await page.goto(base + "/");
    await page.waitForSelector("text=Brokers");
    seen.cluster = await page.textContent("main");

    await page.click("header nav >> text=Topics");
    await page.fill("#search", topic.slice(0, 12));
    await page.press("#search", "Enter");
    await page.waitForSelector(`a:has-text("${topic}")`);
    seen.topics = await page.textContent("main");

    // A write through a form (the CSRF token goes with it).
    const made = topic + "-made";
    await page.fill("#create-topic input[name=name]", made);
    await page.fill("#create-topic input[name=partitions]", "3");
    await page.click("#create-topic button");
    // The form re-renders the list once the topic is made: it is listed.
    await page.waitForSelector(`a:text-is("${made}")`);
    seen.created = await page.textContent("main");
    // Back to the search for the topic, by its address this time.
    await page.evaluate((t) => { location.hash = "#/topics?search=" + encodeURIComponent(t); }, topic);
    await page.waitForSelector(`a:text-is("${topic}")`);

    await page.click(`a:text-is("${topic}")`);
    await page.waitForSelector("text=Ranges and segments");
    seen.topic = await page.textContent("main");

    await page.click("text=messages >> nth=0");
    await page.waitForSelector("text=partition 0");
    await page.waitForSelector("pre");
    seen.messages = await page.textContent("main");

    // Newest first, through the form.
    await page.selectOption("select[name=mode]", "newest");
    await page.click("button:has-text('Show')");
    await page.waitForFunction(() => location.hash.includes("newest=true"));
    // The newest-first page has replaced the oldest-first one.
    await page.waitForFunction(() => {
      const cells = [...document.querySelectorAll("tbody tr td:first-child")].map((c) => Number(c.textContent));
      return cells.length > 1 && cells[0] > cells[cells.length - 1];
    });
    seen.newest_first = await page.$$eval("tbody tr td:first-child", (cells) =>
      cells.map((c) => Number(c.textContent)));
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });

    // A consumer group, from the groups list.
    await page.click("header nav >> text=Consumer groups");
    await page.waitForSelector(`a:has-text("${group}")`);
    await page.click(`a:has-text("${group}")`);
    await page.waitForSelector("text=Offsets and lag");
    seen.group = await page.textContent("main");

    // ACLs and users: a SCRAM user set through the form is listed.
    await page.click("header nav >> text=ACLs, users, quotas");
    await page.waitForSelector("text=SCRAM users");
    await page.fill("#add-user input[name=name]", "browser-user");
    await page.fill("#add-user input[name=password]", "browser-secret");
    await page.click("#add-user button");
    await page.waitForSelector("td >> text=browser-user");
    seen.access = await page.textContent("main");

    // Live rates: drawn, then drawn again from a second sample.
    await page.click("header nav >> text=Live");
    await page.waitForSelector("text=This node");
    await page.waitForSelector(".chart svg polyline", { state: "attached" });
    await page.waitForTimeout(2500);
    seen.live = await page.textContent("main");
    seen.live_charts = await page.$$eval(".chart", (charts) => charts.length);
    seen.errors = errors;
    console.log(JSON.stringify(seen));
  } catch (e) {
    // What the page showed when a step failed (an error box, a form's status).
    const shown = page ? await page.textContent("main").catch(() => "") : "";
    e.message += `\npage errors: ${JSON.stringify(errors)}\nmain showed: ${shown.slice(0, 2000)}`;
    throw e;
  } finally {
    await browser.close();
  }
  if (errors.length) {
    console.error("page errors:", errors);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
