// openai_json.mjs: structured output through the official openai npm package: response_format
// json_schema on chat completions (greedy and seeded, streamed too) gives the same text from a
// plain server (SPECTREE_PLAIN_URL) and a speculating one (SPECTREE_SPEC_URL), JSON that has the
// schema's required keys with the right types; json_object gives an object; an unsupported
// schema keyword is a BadRequestError (400) naming it. Run by test_serve_json.py; exits
// non-zero on the first failed check.
import OpenAI from "openai";

const model = process.env.SPECTREE_MODEL;
const plain = new OpenAI({ baseURL: process.env.SPECTREE_PLAIN_URL, apiKey: "x", maxRetries: 0 });
const spec = new OpenAI({ baseURL: process.env.SPECTREE_SPEC_URL, apiKey: "x", maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error("openai client check failed: " + what);
    process.exit(1);
  }
}

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 8 },
    age: { type: "integer" },
    pet: { enum: ["cat", "dog"] },
    friends: { type: "array", items: { type: "string", pattern: "^[A-Z][a-z]{1,5}$" }, maxItems: 2 },
  },
  required: ["name", "age", "pet", "friends"],
  additionalProperties: false,
};
const messages = [{ role: "user", content: "Tell me about Lily as JSON." }];
for (const temperature of [0, 0.9]) {
  const body = {
    model, messages, max_tokens: 200, temperature, seed: 3,
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  };
  const a = await plain.chat.completions.create(body);
  const b = await spec.chat.completions.create(body);
  const text = a.choices[0].message.content;
  check(text === b.choices[0].message.content, `json_schema at ${temperature}: spec differs`);
  check(a.choices[0].finish_reason === "stop", `json_schema at ${temperature}: not finished`);
  const v = JSON.parse(text);
  check(typeof v.name === "string" && v.name.length <= 8, `name: ${text}`);
  check(Number.isInteger(v.age), `age: ${text}`);
  check(v.pet === "cat" || v.pet === "dog", `pet: ${text}`);
  check(Array.isArray(v.friends) && v.friends.length <= 2 &&
    v.friends.every((f) => /^[A-Z][a-z]{1,5}$/.test(f)), `friends: ${text}`);
  check(Object.keys(v).length === 4, `extra keys: ${text}`);
  let streamed = "";
  for await (const chunk of await spec.chat.completions.create({ ...body, stream: true }))
    if (chunk.choices.length && chunk.choices[0].delta.content)
      streamed += chunk.choices[0].delta.content;
  check(streamed === text, `streamed json_schema at ${temperature} differs`);
}
const o = await spec.chat.completions.create({
  model, messages, max_tokens: 300, temperature: 0, response_format: { type: "json_object" },
});
if (o.choices[0].finish_reason === "stop") {
  const v = JSON.parse(o.choices[0].message.content);
  check(typeof v === "object" && v !== null && !Array.isArray(v), "json_object: not an object");
}
try {
  await spec.chat.completions.create({
    model, messages, max_tokens: 4, response_format: {
      type: "json_schema",
      json_schema: { name: "x", schema: { type: "object", properties: { n: { type: "number", multipleOf: 2 } } } },
    },
  });
  check(false, "multipleOf: no error");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, `multipleOf: ${e}`);
  check(e.param === "response_format.json_schema.schema", `multipleOf: the error names ${e.param}`);
  check(e.message.includes("'multipleOf' at /properties/n"), `multipleOf: ${e.message}`);
}
console.log("  openai client: json_schema and json_object ok");
