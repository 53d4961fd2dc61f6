"""Simplified Chinese UI text, keyed by the English original (see app/ui/i18n.py).

tests/ui/test_ui_i18n.py fails when a translated string in app/ui has no entry here or an
entry loses one of the original's {placeholders}.
"""

ZH_CN: dict[str, str] = {
    # tray and states
    "Open chat": "打开对话",
    "Model": "模型",
    "Local API": "本地 API",
    "Enabled": "已启用",
    "Not running": "未运行",
    "Unavailable: {reason}": "不可用：{reason}",
    "Settings…": "设置…",
    "Quit": "退出",
    "Ready · {tokens} tokens of context": "就绪 · 上下文 {tokens} token",
    "Ready · {tokens} tokens of context · {gib} GiB of VRAM": "就绪 · 上下文 {tokens} token · 显存 {gib} GiB",
    "Busy": "忙碌中",
    "No model loaded": "未加载模型",
    "Loading {model}…": "正在加载 {model}…",
    "Loading {model}: preparing the GPU…": "正在加载 {model}：正在准备 GPU…",
    "Error: {message}": "错误：{message}",
    "empty": "未加载",
    "loading": "加载中",
    "ready": "就绪",
    "error": "出错",
    # notices
    "Could not load the model: {message}": "无法加载模型：{message}",
    "{model} runs with PyTorch on the GPU, without its CUDA kernels (slower): {reason}":
        "{model} 在 GPU 上以 PyTorch 运行，未使用其 CUDA 内核（较慢）：{reason}",
    "{model} runs on the CPU: too large for the GPU without its CUDA kernels, which cannot run here: {reason}":
        "{model} 在 CPU 上运行：不使用 CUDA 内核时它放不进 GPU，而 CUDA 内核在此无法运行：{reason}",
    "Hotkey for {name} not registered: {reason}": "“{name}”的快捷键未注册：{reason}",
    "Local API running at {url}": "本地 API 已在 {url} 运行",
    "No model is ready yet ({state})": "模型尚未就绪（{state}）",
    "Nothing is selected and the clipboard holds no text": "没有选中文字，剪贴板中也没有文本",
    "Internal error: {error}": "内部错误：{error}",
    "A chat history file was unreadable and has been moved to {backup} ({error})":
        "一个对话记录文件无法读取，已移至 {backup}（{error}）",
    "A chat history file was unreadable and could not be moved aside: {file} ({error})":
        "一个对话记录文件无法读取，也无法移开：{file}（{error}）",
    "A chat history file cannot be read and is left as it is: {file} ({error})":
        "一个对话记录文件无法读取，保持原样未动：{file}（{error}）",
    # settings file (app/settings/store.py)
    "{file} could not be used ({error}); it was moved to {backup} and the defaults are used":
        "{file} 无法使用（{error}）；已移至 {backup}，现使用默认设置",
    "{file} could not be used ({error}) and could not be moved aside ({reason}); the defaults are used for now "
    "and the file is left as it is":
        "{file} 无法使用（{error}），也无法移开（{reason}）；本次使用默认设置，该文件保持原样",
    "{file} cannot be read ({error}); the defaults are used for now and the file is left as it is: "
    "check its permissions":
        "无法读取 {file}（{error}）；本次使用默认设置，该文件保持原样：请检查其权限",
    "{file}: {problem}": "{file}：{problem}",
    "{file} had values that could not be used; the file as it was is kept as {backup}":
        "{file} 中有无法使用的值；文件原样保存在 {backup}",
    "The settings of an earlier version were moved into {file}; the old files are kept as {backups}":
        "旧版本的设置已并入 {file}；旧文件保存为 {backups}",
    "Settings not saved: {error}. The change applies until Qwen Tray quits.":
        "设置未保存：{error}。此更改在 Qwen Tray 退出前有效。",
    "Your action {name} had the id {id}, which another action already uses; it is now {new_id}":
        "你的操作“{name}”的 id {id} 已被另一个操作使用；现改为 {new_id}",
    # popup
    "Copy": "复制",
    "Replace selection": "替换所选内容",
    "Retry": "重试",
    "Stop": "停止",
    "Undo": "撤销",
    "Close": "关闭",
    "Thinking…": "思考中…",
    "Writing…": "生成中…",
    "Part {done} of {total}": "第 {done}/{total} 部分",
    "Stopped": "已停止",
    "Error": "错误",
    "Replaced": "已替换",
    "{tps:.1f} tokens/s": "{tps:.1f} 词元/秒",
    # chat
    "Qwen Tray chat": "Qwen Tray 对话",
    "New chat": "新对话",
    "(untitled)": "（无标题）",
    "Ask anything… (Ctrl+Enter to send)": "输入问题…（Ctrl+Enter 发送）",
    "Send": "发送",
    "You": "你",
    "Assistant": "助手",
    "{n} older messages left out to fit the context": "为适应上下文长度，省略了 {n} 条较早的消息",
    # settings
    "Qwen Tray settings": "Qwen Tray 设置",
    "General": "常规",
    "Hotkeys": "快捷键",
    "Actions": "操作",
    "Models": "模型",
    "Action": "操作",
    "Hotkey": "快捷键",
    "Answer": "回答方式",
    "Status": "状态",
    "registered": "已注册",
    "off": "未启用",
    "popup": "弹窗显示",
    "replace": "直接替换",
    "System default": "跟随系统",
    "Language (after restart)": "界面语言（重启后生效）",
    "Translate into": "翻译目标语言",
    "Answer length (tokens)": "回答长度（词元）",
    "Temperature": "温度",
    "Local API port": "本地 API 端口",
    "Run local models on": "本地模型运行于",
    "The GPU when there is one": "有 GPU 时用 GPU",
    "The CPU only (keeps the GPU free)": "仅用 CPU（不占用 GPU）",
    "Name": "名称",
    "Prompt": "提示词",
    "Prompt; {text} is replaced by the selected text": "提示词；{text} 会被替换为所选文字",
    "New action": "新建操作",
    "Save action": "保存操作",
    "Remove": "删除",
    "Kind": "类型",
    "Local folder": "本地文件夹",
    "Remote (OpenAI-compatible)": "远程（兼容 OpenAI）",
    "Folder / file": "文件夹 / 文件",
    "GGUF file (converted once)": "GGUF 文件（首次加载时转换）",
    "GGUF model file": "GGUF 模型文件",
    "Browse…": "浏览…",
    "Base URL": "接口地址",
    "API key": "API 密钥",
    "Model id": "模型 ID",
    "Context (tokens)": "上下文（词元）",
    "Add model": "添加模型",
    "Model folder": "模型文件夹",
    "a model named {name} already exists": "已存在名为 {name} 的模型",
}
