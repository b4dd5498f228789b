// Calls to the Loom REST API (`<base_path>/v1`) with the key the person gave, and the SSE
// stream of a run's events read with `fetch` (an `EventSource` cannot send the key header).

const KEY_STORAGE = "loom.ui.key";

/** The server's base path: what precedes `/ui` in the page's address. */
export const BASE = location.pathname.replace(/\/ui(\/.*)?$/, "");

/** The key kept for this tab (sessionStorage: gone when the tab closes). */
export function storedKey(): string | null {
  return sessionStorage.getItem(KEY_STORAGE);
}

/** Keeps `key` for this tab (`null`: forgets it). */
export function storeKey(key: string | null): void {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

/** An error answer of the API: its status, `kind` and message. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly kind: string,
    message: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = storedKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(response: Response): Promise<ApiFailure> {
  let kind = "http_error";
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      kind = String(body.error.kind ?? kind);
      message = String(body.error.message ?? message);
    }
  } catch {
    // Not JSON: the status line says enough.
  }
  return new ApiFailure(response.status, kind, message);
}

/** `GET` (or `method`) `path` under the base path; the JSON answer, or an `ApiFailure`. */
export async function call<T>(path: string, method = "GET", body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(`${BASE}${path}`, init);
  if (!response.ok) throw await failure(response);
  return (await response.json()) as T;
}

/** One Server-Sent Event. */
export interface StreamEvent {
  id: string | null;
  event: string;
  data: string;
}

/**
 * Reads the SSE stream at `path` until it ends or `signal` aborts: `onEvent` for each event
 * (keep-alive comments are skipped). Resolves when the server ends the stream.
 */
export async function stream(path: string, signal: AbortSignal, onEvent: (event: StreamEvent) => void): Promise<void> {
  const response = await fetch(`${BASE}${path}`, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) throw await failure(response);
  if (!response.body) throw new ApiFailure(0, "stream", "the browser gave no stream body");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end: number;
    while ((end = frameEnd(buffer)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^(\r\n|\r|\n){2}/, "");
      const parsed = parseFrame(frame);
      if (parsed) onEvent(parsed);
    }
  }
}

function frameEnd(buffer: string): number {
  const match = /(\r\n|\r|\n)(\r\n|\r|\n)/.exec(buffer);
  return match ? match.index : -1;
}

function parseFrame(frame: string): StreamEvent | null {
  let id: string | null = null;
  let event = "message";
  const data: string[] = [];
  for (const line of frame.split(/\r\n|\r|\n/)) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return data.length === 0 ? null : { id, event, data: data.join("\n") };
}
