package sim

import (
	"time"

	"github.com/valyala/fasthttp"
)

// The runtime LoRA API, served when Config.AllowRuntimeLoRA is on, as vLLM mounts it under
// VLLM_ALLOW_RUNTIME_LORA_UPDATING (vllm/entrypoints/openai/serving_models.py:
// load_lora_adapter, unload_lora_adapter and their checks).

// serveLoadLoRA answers POST /v1/load_lora_adapter {"lora_name", "lora_path"}. The load takes
// LoRALoadDelay (vLLM's add_lora loads the adapter before answering); the name is checked
// before and after it, so of two loads of one name only the first registers it.
func (e *Engine) serveLoadLoRA(ctx *fasthttp.RequestCtx) {
	name, path, ae := readLoRABody(ctx.PostBody(), true)
	if ae == nil {
		ae = e.checkLoRAFree(name)
	}
	if ae != nil {
		writeError(ctx, ae)
		return
	}
	if d := e.cfg.LoRALoadDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-e.stopCh:
			t.Stop()
			ctx.SetConnectionClose()
			writeError(ctx, errStopping)
			return
		}
	}
	e.mu.Lock()
	_, taken := e.lora.byName[name]
	if !taken {
		e.lora.register(name, path)
		e.lora.apiLoads++
	}
	e.mu.Unlock()
	if taken {
		writeError(ctx, loraTaken(name))
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("Success: LoRA adapter '" + name + "' added successfully.")
}

// serveUnloadLoRA answers POST /v1/unload_lora_adapter {"lora_name"}: the adapter leaves the
// registry at once and its GPU slot when its last running request ends.
func (e *Engine) serveUnloadLoRA(ctx *fasthttp.RequestCtx) {
	name, _, ae := readLoRABody(ctx.PostBody(), false)
	if ae != nil {
		writeError(ctx, ae)
		return
	}
	e.mu.Lock()
	a := e.lora.byName[name]
	if a != nil {
		e.lora.unregister(a)
		e.lora.apiUnloads++
		e.schedule() // a freed slot may let a waiting request in
	}
	e.mu.Unlock()
	if a == nil {
		writeError(ctx, &apiError{status: 404, typ: "NotFoundError", msg: "The lora adapter '" + name + "' cannot be found."})
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("Success: LoRA adapter '" + name + "' removed successfully.")
}

// readLoRABody reads lora_name (and lora_path when load is true) from a load or unload body.
func readLoRABody(body []byte, load bool) (name, path string, ae *apiError) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return "", "", badRequest("cannot parse request body as JSON: " + err.Error())
	}
	name, path = string(v.GetStringBytes("lora_name")), string(v.GetStringBytes("lora_path"))
	if load && (name == "" || path == "") {
		return "", "", invalidUserInput("Both 'lora_name' and 'lora_path' must be provided.")
	}
	if name == "" {
		return "", "", invalidUserInput("'lora_name' needs to be provided to unload a LoRA adapter.")
	}
	return name, path, nil
}

// checkLoRAFree refuses a name already registered.
func (e *Engine) checkLoRAFree(name string) *apiError {
	e.mu.Lock()
	_, taken := e.lora.byName[name]
	e.mu.Unlock()
	if taken {
		return loraTaken(name)
	}
	return nil
}

func loraTaken(name string) *apiError {
	return invalidUserInput("The lora adapter '" + name + "' has already been loaded.")
}

func invalidUserInput(msg string) *apiError {
	return &apiError{status: 400, typ: "InvalidUserInput", msg: msg}
}
