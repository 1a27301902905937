// ViewState: shared zoom/selection (see view_state.h).
#include "gui/core/view_state.h"

namespace ts::gui {

ViewState::ViewState(QObject* parent) : QObject(parent) {}

void ViewState::setStep(int step) {
    if (step < -1) step = -1;
    if (step == m_step) return;
    m_step = step;
    emit stepChanged(m_step);
}

void ViewState::setTimeRange(int64_t fromNs, int64_t toNs) {
    if (toNs < fromNs) std::swap(fromNs, toNs);
    TimeRange r{fromNs, toNs};
    if (m_range && *m_range == r) return;
    m_range = r;
    emit timeRangeChanged(m_range);
}

void ViewState::clearTimeRange() {
    if (!m_range) return;
    m_range.reset();
    emit timeRangeChanged(m_range);
}

void ViewState::selectSlice(const SliceRef& ref) {
    if (ref == m_slice) return;
    m_slice = ref;
    emit sliceSelected(m_slice);
}

void ViewState::clearSelection() { selectSlice(SliceRef{}); }

}  // namespace ts::gui
