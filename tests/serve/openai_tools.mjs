// openai_tools.mjs: tool calling through the official openai npm package, against the server at
// SPECTREE_URL: the tool-calling flow of OpenAI's guide (a call forced with tool_choice, the
// tool's result sent back as a "tool" message with its tool_call_id, the final answer), plain
// and streamed (the call assembled from its deltas), a named function, and a BadRequestError for
// a tool_choice naming no tool. With SPECTREE_SPEC=1 the same requests to SPECTREE_SPEC_URL (a
// speculating server) give the same answers. Run by test_serve_tools.py; exits non-zero on the
// first failed check.
import OpenAI from "openai";

const model = process.env.SPECTREE_MODEL;
const client = new OpenAI({ baseURL: process.env.SPECTREE_URL, apiKey: "x", maxRetries: 0 });
const spec = new OpenAI({ baseURL: process.env.SPECTREE_SPEC_URL, apiKey: "x", maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error("openai client check failed: " + what);
    process.exit(1);
  }
}

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
}, {
  type: "function",
  function: { name: "get_time", parameters: { type: "object", properties: {}, additionalProperties: false } },
}];
// the tool itself, as an application runs it
function getWeather(args) {
  check(typeof args.city === "string" && args.city.length <= 12, `city: ${JSON.stringify(args)}`);
  check(args.unit === "celsius" || args.unit === "fahrenheit", `unit: ${JSON.stringify(args)}`);
  check(Object.keys(args).length === 2, `extra keys: ${JSON.stringify(args)}`);
  return JSON.stringify({ city: args.city, temperature: 21, unit: args.unit });
}

async function streamedAnswer(c, body) {
  let content = "", finish = null;
  const calls = [];
  for await (const chunk of await c.chat.completions.create({ ...body, stream: true })) {
    for (const ch of chunk.choices) {
      if (ch.delta.content) content += ch.delta.content;
      for (const tc of ch.delta.tool_calls ?? []) {
        if (!calls[tc.index]) {
          check(tc.id && tc.type === "function" && tc.function.name, `first delta: ${JSON.stringify(tc)}`);
          calls[tc.index] = { id: tc.id, type: "function", function: { name: tc.function.name, arguments: "" } };
        }
        calls[tc.index].function.arguments += tc.function.arguments ?? "";
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, calls, finish };
}

const messages = [{ role: "user", content: "What is the weather like in Paris?" }];
for (const stream of [false, true]) {
  const first = {
    model, messages, tools, tool_choice: "required", parallel_tool_calls: false,
    max_tokens: 300, temperature: 0,
  };
  let calls, finish;
  if (stream) {
    ({ calls, finish } = await streamedAnswer(client, first));
  } else {
    const r = await client.chat.completions.create(first);
    const m = r.choices[0].message;
    check(m.content === null, `content: ${m.content}`);
    ({ tool_calls: calls } = m);
    finish = r.choices[0].finish_reason;
    if (process.env.SPECTREE_SPEC === "1") {
      const s = await spec.chat.completions.create(first);
      check(JSON.stringify(s.choices[0].message.tool_calls.map((t) => t.function)) ===
        JSON.stringify(calls.map((t) => t.function)), "speculating server: calls differ");
    }
  }
  check(finish === "tool_calls", `finish_reason ${finish}`);
  check(calls.length === 1 && calls[0].id.startsWith("call_"), `calls: ${JSON.stringify(calls)}`);
  const call = calls[0];
  const result = call.function.name === "get_weather"
    ? getWeather(JSON.parse(call.function.arguments))
    : JSON.stringify({ time: "12:00" });
  const followUp = [
    ...messages,
    { role: "assistant", content: null, tool_calls: calls },
    { role: "tool", tool_call_id: call.id, content: result },
  ];
  const second = { model, messages: followUp, tools, max_tokens: 40, min_tokens: 2, temperature: 0, tool_choice: "none" };
  let answer;
  if (stream) {
    const s = await streamedAnswer(client, second);
    check(s.calls.length === 0 && (s.finish === "stop" || s.finish === "length"), `final: ${JSON.stringify(s)}`);
    answer = s.content;
  } else {
    const r = await client.chat.completions.create(second);
    check(!r.choices[0].message.tool_calls, "final: tool_calls with tool_choice none");
    answer = r.choices[0].message.content;
  }
  check(typeof answer === "string" && answer.trim().length > 0, `final answer: ${answer}`);
  console.log(`  openai client${stream ? " (streamed)" : ""}: ${call.function.name}(${call.function.arguments}) -> ${JSON.stringify(answer.slice(0, 40))}`);
}
const named = await client.chat.completions.create({
  model, messages, tools, max_tokens: 200, temperature: 0, parallel_tool_calls: false,
  tool_choice: { type: "function", function: { name: "get_time" } },
});
check(named.choices[0].finish_reason === "tool_calls", `named: ${JSON.stringify(named.choices[0])}`);
check(named.choices[0].message.tool_calls.every((t) => t.function.name === "get_time"), "named: not get_time");
check(JSON.stringify(JSON.parse(named.choices[0].message.tool_calls[0].function.arguments)) === "{}", "named: arguments");
try {
  await client.chat.completions.create({
    model, messages, tools, max_tokens: 4, tool_choice: { type: "function", function: { name: "nope" } },
  });
  check(false, "unknown tool_choice name: no error");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, `unknown name: ${e}`);
  check(e.param === "tool_choice" && e.message.includes("'nope'"), `unknown name: ${e.param} ${e.message}`);
}
console.log("  openai client: named function and a bad tool_choice ok");
