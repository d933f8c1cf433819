// page_test.mjs: drives the chat page of `spectree serve` (GET /) in Debian's headless chromium
// through playwright-core: fills the system prompt, temperature, max tokens and seed, types a
// message, sends it and waits for the streamed answer, which must equal the answer of the same
// seeded request made to /v1/chat/completions directly (not streamed); the statistics row must
// show the API's token count, tau and accepted-length histogram. Two turns (the second carries
// the first), a screenshot, Stop, New chat, then the API key field on a server that wants one.
// Run by test_page.py with SPECTREE_URL (the server), SPECTREE_CHROMIUM (the browser),
// SPECTREE_SHOT (the screenshot's path), SPECTREE_KEY_URL and SPECTREE_KEY (a server with
// --api-key). Exits non-zero with a message on the first failed check.
import { chromium } from "playwright-core";

const url = process.env.SPECTREE_URL;
const shot = process.env.SPECTREE_SHOT;
const keyUrl = process.env.SPECTREE_KEY_URL; // a server with --api-key KEY, named "keyed"
const key = process.env.SPECTREE_KEY;
const settings = { system: "You are a storyteller.", temperature: 0.8, max_tokens: 48, seed: 12 };

function check(cond, what) {
  if (!cond) throw new Error(what);
}

// A bounded run: the whole test stops by itself.
const watchdog = setTimeout(() => {
  console.error("page test: no result in 150 s");
  process.exit(1);
}, 150000);

async function api(messages) {
  const r = await fetch(url + "/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({
      messages, temperature: settings.temperature, max_tokens: settings.max_tokens,
      seed: settings.seed,
    }),
    signal: AbortSignal.timeout(60000),
  });
  check(r.status === 200, "the API's status: " + r.status);
  return r.json();
}

// Types text into the message box, sends it with Enter and waits for the answer; returns the
// answer's text, its statistics row and how many distinct texts the answer showed while it grew.
async function turn(page, text, n) {
  await page.locator("#input").pressSequentially(text);
  const streamed = page.waitForResponse((r) => r.url().endsWith("/v1/chat/completions"));
  await page.locator("#input").press("Enter");
  const res = await streamed;
  check(res.headers()["content-type"].startsWith("text/event-stream"),
        "the page's request was not streamed: " + res.headers()["content-type"]);
  const answer = page.locator(".msg.assistant").nth(n);
  await answer.and(page.locator("[data-done]")).waitFor({ timeout: 60000 });
  await page.locator("body[data-state=idle]").waitFor({ timeout: 10000 });
  const updates = await page.evaluate(() => (window.__updates || []).length);
  return {
    text: await answer.locator(".content").textContent(),
    stats: answer.locator(".stats"),
    updates,
  };
}

async function checkStats(stats, want, what) {
  const tokens = await stats.locator(".stat-tokens b").textContent();
  check(tokens === String(want.usage.completion_tokens),
        `${what}: tokens ${tokens}, the API's ${want.usage.completion_tokens}`);
  const tps = parseFloat(await stats.locator(".stat-tok-s b").textContent());
  check(tps > 0, `${what}: tok/s ${tps}`);
  const meta = want.meta_info;
  check(meta.spec_steps > 0, `${what}: the server ran no speculative step`);
  const tau = await stats.locator(".stat-tau b").textContent();
  check(Math.abs(parseFloat(tau) - meta.spec_tau) < 0.006, `${what}: tau ${tau}, the API's ${meta.spec_tau}`);
  const hist = (await stats.locator(".hist-text").textContent()).trim();
  const wantHist = meta.spec_accept_histogram.map((c, k) => k + ":" + c).join(" ");
  check(hist === wantHist, `${what}: accepted "${hist}", the API's "${wantHist}"`);
  check((await stats.locator(".hist .bar").count()) === meta.spec_accept_histogram.length,
        `${what}: histogram bars`);
}

const browser = await chromium.launch({
  executablePath: process.env.SPECTREE_CHROMIUM,
  headless: true,
  timeout: 60000,
  // without the background-networking flags chromium's own connections wait on a closed network
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  const problems = [];
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console: " + m.text()); });
  page.on("request", (r) => {
    if (!r.url().startsWith(url + "/") && !(keyUrl && r.url().startsWith(keyUrl + "/")))
      problems.push("a request off the server: " + r.url());
  });
  const res = await page.goto(url + "/");
  check(res.status() === 200, "GET /: " + res.status());
  const models = await (await fetch(url + "/v1/models")).json();
  await page.locator("#model", { hasText: models.data[0].id }).waitFor({ timeout: 10000 });
  // every text the answers show, to see them grow as the events arrive
  await page.evaluate(() => {
    window.__updates = [];
    new MutationObserver(() => {
      const c = document.querySelectorAll(".msg.assistant .content");
      if (c.length) window.__updates.push(c[c.length - 1].textContent);
    }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });

  await page.locator("#system").fill(settings.system);
  await page.locator("#temperature").fill(String(settings.temperature));
  await page.locator("#max-tokens").fill(String(settings.max_tokens));
  await page.locator("#seed").fill(String(settings.seed));

  const q1 = "Tell me a story about a little dog.";
  const a1 = await turn(page, q1, 0);
  const msgs = [{ role: "system", content: settings.system }, { role: "user", content: q1 }];
  const w1 = await api(msgs);
  const want1 = w1.choices[0].message.content;
  check(want1.length > 0, "the API's answer is empty");
  check(a1.text === want1, `turn 1: the page streamed ${JSON.stringify(a1.text)}, the API answered ${JSON.stringify(want1)}`);
  await checkStats(a1.stats, w1, "turn 1");
  console.log(`turn 1: ${w1.usage.completion_tokens} tokens, equal to the API's; ${a1.updates} updates on the page`);

  const q2 = "What happened next?";
  const a2 = await turn(page, q2, 1);
  msgs.push({ role: "assistant", content: want1 }, { role: "user", content: q2 });
  const w2 = await api(msgs);
  const want2 = w2.choices[0].message.content;
  check(a2.text === want2, `turn 2: the page streamed ${JSON.stringify(a2.text)}, the API answered ${JSON.stringify(want2)}`);
  await checkStats(a2.stats, w2, "turn 2");
  console.log(`turn 2: ${w2.usage.completion_tokens} tokens, equal to the API's`);
  if (shot) await page.screenshot({ path: shot });

  // Stop: the request aborted as soon as it went (send() sets up its AbortController before its
  // first await), the answer marked stopped, the page usable again.
  await page.locator("#input").fill("And then?");
  await page.evaluate(() => {
    document.getElementById("form").requestSubmit();
    document.getElementById("stop").click();
  });
  const a3 = page.locator(".msg.assistant").nth(2);
  await a3.and(page.locator("[data-done]")).waitFor({ timeout: 30000 });
  await page.locator("body[data-state=idle]").waitFor({ timeout: 10000 });
  check((await a3.locator(".stat-finish b").textContent()) === "stopped", "Stop: not marked stopped");
  check(!(await a3.evaluate((e) => e.classList.contains("error"))), "Stop: shown as an error");
  check(!(await page.locator("#send").isDisabled()), "Stop: Send stays disabled");

  // New chat: the conversation starts over, so the first answer comes again.
  await page.locator("#clear").click();
  check((await page.locator(".msg").count()) === 0, "New chat: messages left");
  const a4 = await turn(page, q1, 0);
  check(a4.text === want1, "New chat: the first answer did not come again");
  check(problems.length === 0, problems.join("; "));
  console.log("stop and new chat: ok");

  // A server with --api-key: the page loads without it, a message sent without the key shows
  // the server's error and leaves the conversation as it was, one sent with it is answered.
  if (keyUrl) {
    await page.goto(keyUrl + "/");
    await page.locator("#seed").fill(String(settings.seed));
    await page.locator("#input").fill("Hello.");
    await page.locator("#input").press("Enter");
    const bad = page.locator(".msg.assistant.error");
    await bad.waitFor({ timeout: 30000 });
    const err = await bad.locator(".content").textContent();
    check(/API key/.test(err), "no key: the page shows " + JSON.stringify(err));
    await page.locator("body[data-state=idle]").waitFor({ timeout: 10000 });
    await page.locator("#api-key").fill(key);
    await page.locator("#api-key").press("Tab"); // "change": the model's name comes
    await page.locator("#model", { hasText: "keyed" }).waitFor({ timeout: 10000 });
    await page.locator("#clear").click();
    const a = await turn(page, "Hello.", 0);
    check(a.text.length > 0 && !(await page.locator(".msg.error").count()), "with the key: no answer");
    console.log("api key: ok");
  }
  // the 401 of the keyed server's first /v1/models is the one console error expected
  const unexpected = problems.filter((p) => !(keyUrl && p.includes("401")));
  check(unexpected.length === 0, unexpected.join("; "));
} catch (e) {
  console.error("page test failed: " + e.message);
  failed = true;
} finally {
  await browser.close();
  clearTimeout(watchdog);
}
process.exit(failed ? 1 : 0);
