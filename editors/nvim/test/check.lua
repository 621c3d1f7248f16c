-- Run in the buffer of a .est file with one unknown name: waits for the diagnostics of
-- estc lsp and checks them, then opens the whole program $EST_GOOD and checks the
-- inlay hint of its `let h`; quits with status 0, or 1 with a message on failure.
local function fail(msg)
  io.stderr:write("nvim test: " .. msg .. "\n")
  vim.cmd("cquit 1")
end

local buf = vim.api.nvim_get_current_buf()
if vim.bo[buf].filetype ~= "est" then
  fail("filetype is '" .. vim.bo[buf].filetype .. "', not 'est'")
end
if vim.bo[buf].commentstring ~= "// %s" then
  fail("commentstring is '" .. vim.bo[buf].commentstring .. "'")
end
local ok = vim.wait(30000, function()
  return #vim.diagnostic.get(buf) > 0
end, 50)
if not ok then
  fail("no diagnostics from estc lsp within 30 s")
end
local d = vim.diagnostic.get(buf)
if #d ~= 1 then
  fail("expected 1 diagnostic, got " .. #d .. ": " .. vim.inspect(d))
end
-- `code` is a field of its own from Neovim 0.8; 0.7 keeps the LSP's diagnostic aside.
local code = d[1].code or (d[1].user_data and d[1].user_data.lsp and d[1].user_data.lsp.code)
local want = "unknown name `zzz`"
if code ~= "E0201" or d[1].message:sub(1, #want) ~= want or d[1].lnum ~= 2 or d[1].col ~= 14 then
  fail("unexpected diagnostic: " .. vim.inspect(d[1]))
end
if d[1].severity ~= vim.diagnostic.severity.ERROR then
  fail("not an error: " .. vim.inspect(d[1]))
end

-- inlay hints: drawn by the setup at the end of the line (Neovim < 0.10), or by Neovim
vim.cmd("edit " .. vim.env.EST_GOOD)
local good = vim.api.nvim_get_current_buf()
local want_hint = "h: f32[8, 16]"
local function hint_on_line(l)
  if vim.fn.has("nvim-0.10") == 1 then
    local hs = vim.lsp.inlay_hint.get({ bufnr = good })
    for _, h in ipairs(hs) do
      if h.inlay_hint.position.line == l then
        return "h" .. h.inlay_hint.label
      end
    end
    return nil
  end
  local ns = vim.api.nvim_create_namespace("est_inlay_hints")
  local marks = vim.api.nvim_buf_get_extmarks(good, ns, { l, 0 }, { l, -1 }, { details = true })
  if #marks == 0 then
    return nil
  end
  return marks[1][4].virt_text[1][1]
end
local shown = nil
local hinted = vim.wait(30000, function()
  shown = hint_on_line(5)
  return shown ~= nil
end, 50)
if not hinted then
  fail("no inlay hint on line 6 of the program within 30 s")
end
if not shown:find(want_hint, 1, true) then
  fail("the hint of `let h` is '" .. shown .. "', not '" .. want_hint .. "'")
end
io.stdout:write("nvim test: ok (Neovim " .. tostring(vim.version().major) .. "." .. tostring(vim.version().minor) .. ", " .. code .. " at 3:15, hint " .. want_hint .. ")\n")
vim.cmd("qall!")
