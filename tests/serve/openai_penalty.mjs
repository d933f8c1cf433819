// openai_penalty.mjs: the penalties and biases through the official openai npm package:
// presence_penalty, frequency_penalty and logit_bias on completions and chat (streamed too)
// give the same text from a plain server (SPECTREE_PLAIN_URL) and a speculating one
// (SPECTREE_SPEC_URL), a text the penalties change; bad values are a BadRequestError (400)
// naming the field. Run by test_serve_penalty.py; exits non-zero on the first failed check.
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

const pen = { presence_penalty: 0.7, frequency_penalty: 0.5, logit_bias: { 261: -100, 300: 2 } };
const prompt = "Once upon a time";
const free = await plain.completions.create({ model, prompt, max_tokens: 40, temperature: 0 });
for (const temperature of [0, 0.9]) {
  const body = { model, prompt, max_tokens: 40, temperature, seed: 5, ...pen };
  const a = await plain.completions.create(body);
  const b = await spec.completions.create(body);
  check(a.choices[0].text === b.choices[0].text, `completion at ${temperature}: spec differs`);
  if (temperature === 0)
    check(a.choices[0].text !== free.choices[0].text, "the penalties change nothing");
  let streamed = "";
  for await (const chunk of await spec.completions.create({ ...body, stream: true }))
    if (chunk.choices.length) streamed += chunk.choices[0].text;
  check(streamed === a.choices[0].text, `streamed completion at ${temperature} differs`);
  const chat = { model, messages: [{ role: "user", content: "Tell me a story" }],
    max_tokens: 32, temperature, seed: 5, ...pen };
  const c = await plain.chat.completions.create(chat);
  const d = await spec.chat.completions.create(chat);
  check(c.choices[0].message.content === d.choices[0].message.content,
    `chat at ${temperature}: spec differs`);
}
for (const [field, value] of [["presence_penalty", 2.5], ["frequency_penalty", -3],
  ["logit_bias", { 261: 500 }]]) {
  try {
    await spec.chat.completions.create({
      model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4, [field]: value,
    });
    check(false, `${field}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `${field}: ${e}`);
    check(e.param === field, `${field}: the error names ${e.param}`);
  }
}
console.log("openai npm client: penalties and biases equal with and without speculation");
