// Drives qemu-mcp through the official MCP TypeScript SDK client, over
// stdio, the way Claude Code does, and checks what that client's user (the
// model) would get: the sizes of JSON.stringify(structuredContent), each
// piece of console text once, paging through every byte, waits that start
// after the echo, default waits that end as timed_out within 60 s, and
// schemas without nullable unions. Prints one JSON report on stdout; exits
// 1 if a check fails.
//
// Usage: node check.mjs <qemu-mcp command> [args...]   (env passes through)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const failures = [];
const sizes = {};
const check = (ok, what) => { if (!ok) failures.push(what); };
const size = (res) => JSON.stringify(res.structuredContent ?? null).length;
const text = (res) => (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");

const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "qemu-mcp-ts-check", version: "1.0.0" });
await client.connect(transport);

async function call(name, args, opts) {
  const res = await client.callTool({ name, arguments: args }, undefined, opts);
  if (res.isError) throw new Error(`${name}: ${text(res)}`);
  sizes[`${name} ${JSON.stringify(args)}`] = size(res);
  return res;
}

try {
  // Schemas: plain types, no nullable unions.
  const { tools } = await client.listTools();
  sizes["tools/list"] = JSON.stringify(tools).length;
  const unions = [];
  const walk = (where, v) => {
    if (Array.isArray(v)) return v.forEach((e) => walk(where, e));
    if (v && typeof v === "object") {
      if (Array.isArray(v.type)) unions.push(`${where}: ${JSON.stringify(v.type)}`);
      for (const [k, e] of Object.entries(v)) walk(`${where}.${k}`, e);
    }
  };
  for (const t of tools) { walk(`${t.name}.input`, t.inputSchema); walk(`${t.name}.output`, t.outputSchema); }
  check(unions.length === 0, `nullable unions: ${unions.join(", ")}`);

  // The boot of the built-in kernel: under 2,000 characters.
  const boot = await call("qemu_boot", { wait_for: "tiny> $" });
  check(boot.structuredContent.matched === true, "boot did not reach the prompt");
  check(size(boot) < 2000, `boot result is ${size(boot)} characters`);

  // A 200 KB flood with a wait: under 40,000, the output once, truncated,
  // and a cursor that pages through every byte.
  const flood = await call("serial_send", { data: "flood 200000", wait_for: "tiny> $" });
  const f = flood.structuredContent;
  const sc = JSON.stringify(f);
  check(size(flood) < 40000, `flood result is ${size(flood)} characters`);
  check(sc.split("flood done 200000").length === 2, "the flood's end marker is not in the result exactly once");
  check(f.truncated === true && f.elided, "flood result is not marked truncated with elided cursors");
  let paged = 0;
  for (let since = f.elided.start; since < f.elided.end;) {
    const r = (await call("serial_read", { since, raw: true })).structuredContent;
    if (r.output_start !== since || r.cursor <= since) { failures.push(`page from ${since}: ${JSON.stringify(r).slice(0, 200)}`); break; }
    paged += Math.min(r.cursor, f.elided.end) - since;
    since = r.cursor;
  }
  check(paged === f.elided.end - f.elided.start, `paged ${paged} of ${f.elided.end - f.elided.start} elided bytes`);

  // A wait for what was typed ends on the guest's answer, not the echo.
  const zz = (await call("serial_send", { data: "zz-42", wait_for: "zz-42" })).structuredContent;
  check(zz.output === "zz-42\nunknown command: zz-42", `zz-42 ended on ${JSON.stringify(zz.output)}`);

  // Default waits end as timed_out within 60 s (the SDK's own request
  // time-out): serial_read's and qemu_boot's.
  for (const [name, a] of [["serial_read", { wait_for: "never printed" }],
                           ["qemu_boot", { instance: "slow", wait_for: "never printed" }]]) {
    const t0 = Date.now();
    const r = (await call(name, a)).structuredContent;
    const secs = (Date.now() - t0) / 1000;
    sizes[`${name} default wait seconds`] = Math.round(secs * 10) / 10;
    check(r.timed_out === true && secs < 60, `${name} default wait: timed_out ${r.timed_out} after ${secs} s`);
  }
  await call("qemu_shutdown", { instance: "slow" });
  await call("qemu_shutdown", {});
} catch (e) {
  failures.push(String(e));
} finally {
  await client.close();
}
console.log(JSON.stringify({ sdk: "@modelcontextprotocol/sdk", sizes, failures }, null, 1));
process.exit(failures.length ? 1 : 0);
